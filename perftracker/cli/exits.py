"""Exit codes, the same for every command (issue 47; `perftracker --help` lists them):
0 done, 1 a failure (one line on stderr), 2 a usage error (argparse's, and options that do not go
together), 124 a wait that timed out (coreutils' `timeout` code; `perftracker trigger`)."""

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_TIMEOUT = 124
