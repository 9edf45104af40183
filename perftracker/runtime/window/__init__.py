"""The profile window in the training process: its run, state, instruments, writer, hand-off, exit, cost and budget."""
