"""One experiment: its config resolved into plugins (resolve.py), its dataset and split (federation.py) and the
probe diagnostics of its model (diagnostics.py); the client, the server and the engines all take it."""
