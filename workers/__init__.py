"""hangscope's compute-node worker: stdlib only (psutil optional), Python >= 3.9, never imports app/."""

# Reported in the hello; bumped together with app.__version__.
WORKER_VERSION = "0.1.0"
