"""SLURM support: resolve a job id to its nodes (job.py, resolve.py) and reach them through srun (srun.py)."""
