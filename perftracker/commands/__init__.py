"""One module per CLI command. Each defines HELP, add_arguments(parser) and run(args) -> int."""
