"""The `perftracker` command line: ``main`` in main.py, one module per command beside it.

Each command module defines HELP, add_arguments(parser) and run(args) -> int. The CLI is the top
layer: it may import every other part of perftracker.
"""
