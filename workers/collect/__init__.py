"""Collection on the node: py-spy, strace, gdb and /proc readers, each under a deadline and a state check."""
