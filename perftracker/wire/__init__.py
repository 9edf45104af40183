"""Encodings between the stages: the worker <-> node agent frames, the columnar pattern uploads, and
the strict JSON of the localizer's HTTP bodies and stored reports."""
