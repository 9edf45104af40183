"""Encodings between the stages: the worker <-> node agent frames and the columnar pattern uploads."""
