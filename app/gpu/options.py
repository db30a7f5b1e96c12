"""Settings of the GPU tests (one frozen dataclass), with defaults that suit GPUs and CPU-only nodes alike."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

from app.gpu.bench import sweep

Backend = Literal["auto", "nccl", "gloo"]

GPU_SIZES = sweep(1 << 10, 1 << 30)  # 1 KiB .. 1 GiB, x4 (nccl-tests -b 1K -e 1G -f 4)
CPU_SIZES = sweep(1 << 10, 16 << 20)  # gloo on CPUs: the same shape, up to 16 MiB
GPU_PAIR_SIZE = 256 << 20
CPU_PAIR_SIZE = 4 << 20


@dataclass(frozen=True)
class GpuTestOptions:
    python: Optional[str] = None  # the job's interpreter; None: from the ranks' /proc/PID/exe on each node
    backend: Backend = "auto"  # auto: nccl when every rank sees a GPU, else gloo (decided by the ranks)
    timeout: float = 60.0  # hung: no progress for this long once every rank has started
    startup_timeout: float = 180.0  # every rank must have imported torch and begun to rendezvous by then
    max_duration: float = 1800.0  # hard deadline of one launch on a node (the worker kills it there)
    procs_per_node: Optional[int] = None  # None: one per GPU, one per CPU-only node
    sizes: Optional[tuple[int, ...]] = None  # bench sweep in bytes; None: GPU_SIZES or CPU_SIZES
    warmup: int = 5
    iters: int = 20
    pair_size: Optional[int] = None  # message size of pair tests; None: GPU_PAIR_SIZE or CPU_PAIR_SIZE
    pair_iters: int = 10
    slow_ratio: float = 0.5  # a pair is slow below this fraction of the median busbw
    min_busbw: Optional[float] = None  # GB/s: a pair below this is slow whatever the median
    all_pairs: bool = False  # test every pair of nodes (round-robin), not only until a fault is explained
    gpu_pairs: bool = True  # also pair the GPUs inside each node (CUDA_VISIBLE_DEVICES=i,j)
    nccl_debug: bool = True  # NCCL_DEBUG=INFO, parsed into the interface/transport NCCL chose
    env: tuple[tuple[str, str], ...] = ()  # extra NCCL_*/GLOO_*/... settings for the ranks
    targets: tuple[tuple[str, int], ...] = ()  # net: address:port to check; default the job's MASTER_ADDR:PORT
    master_addr: Optional[str] = None  # how the ranks reach the first node; None: its hostname
    port_range: tuple[int, int] = (29500, 29999)
    allow_busy_gpus: bool = False  # run even on GPUs that processes (the hung job) still hold
    check_timeout: float = 3.0  # net: per connection attempt
