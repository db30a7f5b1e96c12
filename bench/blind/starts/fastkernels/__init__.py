"""Fused kernels for the model (a stand-in for a compiled extension): each op has several candidate tile
configurations; the fastest one per device is chosen by autotuning on first import and cached on the node
($FASTKERNELS_CACHE/dev<N>.json, N = $FASTKERNELS_DEVICE)."""

from __future__ import annotations

from .autotune import ensure_tuned

OPS = ("fused_linear_relu", "fused_mse")
CANDIDATES = {op: [{"tile": t} for t in (16, 32, 64)] for op in OPS}

TUNED = ensure_tuned(OPS)
