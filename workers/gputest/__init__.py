"""Node side of the GPU tests: the torch test program, its launcher, port finding, network and GPU probes."""
