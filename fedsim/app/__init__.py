"""The roof: what a person or a program calls (the command line, the Python API, fedsim local, reports, plots,
the plugin listing), on top of every other package; nothing below imports it."""
