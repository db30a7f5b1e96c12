"""GPU tests and benchmarks launched from hangscope on the job's nodes: sanity, bandwidth, pair isolation, net.

Login side only (the programs that run on nodes live in workers/gputest/); never imports textual.
"""
