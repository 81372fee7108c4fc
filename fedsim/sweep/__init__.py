"""``fedsim sweep``: one base config, a grid (and/or explicit cells) of overrides, every run.

:mod:`fedsim.sweep.plan` reads the sweep file and plans its cells (names, directories, validated configs, where
each stands); :mod:`fedsim.sweep.execute` runs them (in this process, as processes, or on Ray).
"""
