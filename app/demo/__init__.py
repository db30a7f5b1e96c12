"""The demo job: a local torch.distributed (gloo) job that hangs in a chosen way (job.py), started and stopped
by runner.py. `hangscope demo` (app/cli/demo.py) runs it and investigates it."""
