"""hangscope's compute-node worker: stdlib only (psutil optional), Python >= 3.9, never imports app/."""
