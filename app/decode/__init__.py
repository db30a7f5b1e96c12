"""Decoding: the worker's replies (workers/protocol.py's message shapes) turned into the model (app/model).

replies.py decodes hello, discovered ranks, dumps, strace and gdb results; flight.py the PyTorch Flight Recorder
record a dump carries. Pure functions, no I/O: remote data is checked value by value as it is taken.
"""
