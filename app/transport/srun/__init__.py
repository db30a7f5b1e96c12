"""The srun transport: workers on a SLURM job's nodes through one `srun --overlap` step, no SSH.

transport.py opens workers (SrunTransport), step.py runs a step and demultiplexes its nodes' streams,
mux.py frames both directions, stage.py is the node side of the step (shipped as source, not imported there).
"""

from app.transport.srun.step import SrunOptions
from app.transport.srun.transport import SrunTransport

__all__ = ["SrunOptions", "SrunTransport"]
