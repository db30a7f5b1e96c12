"""`hangscope HOSTS --test sanity|bench|pairs|net`: run a GPU test without the TUI, print a table, write JSON.

For the CLI: `add_test_arguments(parser)` adds the options, `options_from_args(args)` checks them (InputError,
exit 2, before anything connects), `run_tests_headless(hosts, kind, options, ...)` runs the test and returns
(results, exit code): 0 passed, 1 a problem was found or a node could not be tested, 130 interrupted.
Setup failures (busy GPUs without --allow-busy-gpus, no interpreter) raise HangscopeError subclasses.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any, Optional, Sequence, TextIO

import re

from app.errors import InputError
from app.gpu.bench import MAX_SIZES, SIZE, parse_sizes
from app.inputs import numbers
from app.inputs.text import check_text, text_arg

if TYPE_CHECKING:
    from app.gpu.model import GpuTestResults, TestKind
    from app.gpu.options import GpuTestOptions

# Every command line builds the parser, so this module is imported by every run, --snapshot and --print
# included: what only a test run needs (app.gpu.model, events, table, the codec) is imported where it is used.

KINDS = ("sanity", "bench", "pairs", "net")
SCHEMA = "hangscope.gputest"
EXIT_OK, EXIT_PROBLEM, EXIT_INTERRUPTED = 0, 1, 130
_ADDRESS = re.compile(r"[A-Za-z0-9_.:%\[\]-]{1,253}", re.ASCII)


TEST_TIMEOUT = numbers.seconds(1, 3600)
STARTUP_TIMEOUT = numbers.seconds(1, 3600)
ITERS = numbers.count(1, 10000)
WARMUP = numbers.count(0, 1000)
PROCS_PER_NODE = numbers.count(1, 256)
SLOW_RATIO = numbers.ratio(0, 1)  # a pair is slow below R x the median: R >= 1 would call the median slow
MIN_BUSBW = numbers.rate(0, 100000, "GB/s")


def add_test_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("GPU tests (run on the nodes, outside the hung job)")
    g.add_argument("--test", choices=KINDS, help="sanity: all_reduce+barrier on every GPU; bench: all_reduce "
                   "bandwidth sweep; pairs: find the bad node or link; net: interfaces and port reachability")
    g.add_argument("--backend", choices=("auto", "nccl", "gloo"), default="auto",
                   help="auto: nccl when every rank sees a GPU, else gloo")
    numbers.add_number(g, "--test-timeout", kind=TEST_TIMEOUT, default=60.0, metavar="S",
                       help="a test hangs after S seconds without progress")
    numbers.add_number(g, "--startup-timeout", kind=STARTUP_TIMEOUT, default=180.0, metavar="S",
                       help="every rank must have started within S seconds")
    g.add_argument("--sizes", metavar="LIST", type=sizes_arg,
                   help=f"bench sizes, e.g. 1K,1M,64M or 1K:1G (x4 steps) or 1K:1G:2 (x2 steps); each {SIZE.range}, "
                   f"at most {MAX_SIZES}")
    numbers.add_number(g, "--iters", kind=ITERS, default=20, metavar="N", help="timed iterations per size")
    numbers.add_number(g, "--warmup", kind=WARMUP, default=5, metavar="N", help="warm-up iterations per size")
    numbers.add_number(g, "--procs-per-node", kind=PROCS_PER_NODE, metavar="N",
                       help="ranks per node (default: one per GPU, or 1)")
    numbers.add_number(g, "--pair-size", kind=SIZE, metavar="SIZE",
                       help="message size of pair tests (default 256M on GPUs, 4M on CPUs)")
    numbers.add_number(g, "--slow-ratio", kind=SLOW_RATIO, default=0.5, metavar="R",
                       help="a pair is slow below R x the median busbw")
    numbers.add_number(g, "--min-busbw", kind=MIN_BUSBW, metavar="GBPS", help="a pair is slow below this busbw")
    g.add_argument("--all-pairs", action="store_true", help="test every pair of nodes (round-robin)")
    g.add_argument("--no-gpu-pairs", action="store_true", help="do not pair the GPUs inside each node")
    g.add_argument("--no-nccl-debug", action="store_true", help="do not set NCCL_DEBUG=INFO for the ranks")
    g.add_argument("--nccl-env", action="append", default=[], metavar="NAME=VALUE", type=text_arg("--nccl-env"),
                   help="extra NCCL_*/GLOO_*/TORCH_* setting for the ranks (repeatable)")
    g.add_argument("--target", action="append", default=[], metavar="HOST:PORT", type=text_arg("--target"),
                   help="net: address:port every node must reach (default: the job's MASTER_ADDR:PORT)")
    g.add_argument("--master-addr", metavar="ADDR", type=master_addr,
                   help="how ranks reach the first node (default: its hostname)")
    g.add_argument("--allow-busy-gpus", action="store_true",
                   help="start even on GPUs that processes (the hung job) still hold")
    g.add_argument("--json", dest="json_path", metavar="FILE", type=text_arg("--json"),
                   help="also write the results as JSON to FILE (a new or regular file, as --snapshot)")


def sizes_arg(text: str) -> tuple[int, ...]:
    """`--sizes`, parsed by the GPU tests' own parser (app.gpu.bench)."""
    return parse_sizes(text)


def master_addr(text: str) -> str:
    """`--master-addr`: a host name or address the ranks connect to (no spaces, no option, no shell)."""
    check_text(text, "--master-addr", max_len=253)
    if text.startswith("-") or not _ADDRESS.fullmatch(text):
        raise InputError(f"--master-addr {text!r}: expected a host name or an IP address")
    return text


def _target(text: str) -> tuple[str, int]:
    """`--target HOST:PORT` (`[ADDR]:PORT` for IPv6): ASCII digits for the port, 1-65535."""
    host, sep, port = text.rpartition(":")
    if host.startswith("[") or host.endswith("]"):
        if not (host.startswith("[") and host.endswith("]")):
            raise InputError(f"--target {text!r}: an unclosed '[' (IPv6 is written [ADDR]:PORT)")
        host = host[1:-1]
    if (not sep or not host or host.startswith("-") or not _ADDRESS.fullmatch(host) or not port.isascii()
            or not port.isdigit() or len(port) > 5 or not 0 < int(port) < 65536):
        raise InputError(f"--target {text!r}: expected HOST:PORT with a port from 1 to 65535, e.g. node01:29500")
    return host, int(port)


def options_from_args(args: argparse.Namespace) -> GpuTestOptions:
    """GpuTestOptions from parsed arguments; bad values raise InputError before anything connects (the parser's
    types check what comes from the command line; the ranges are checked again here for values set in code)."""
    def get(name: str, default: Any = None) -> Any:  # the lead's parser may lack some of these options
        return getattr(args, name, default)

    TEST_TIMEOUT.check(get("test_timeout", 60.0), "--test-timeout")
    STARTUP_TIMEOUT.check(get("startup_timeout", 180.0), "--startup-timeout")
    ITERS.check(get("iters", 20), "--iters")
    WARMUP.check(get("warmup", 5), "--warmup")
    SLOW_RATIO.check(get("slow_ratio", 0.5), "--slow-ratio")
    for dest, flag, kind in (("procs_per_node", "--procs-per-node", PROCS_PER_NODE),
                             ("min_busbw", "--min-busbw", MIN_BUSBW), ("pair_size", "--pair-size", SIZE)):
        if get(dest) is not None:
            kind.check(get(dest), flag)
    env = []
    for item in get("nccl_env", []) or []:
        name, sep, value = item.partition("=")
        if not sep or not name.replace("_", "").isalnum() or not name.isascii() or not name.startswith(
                ("NCCL_", "GLOO_", "TORCH_", "CUDA_", "UCX_", "FI_")) or not value.isprintable():
            raise InputError(f"--nccl-env {item!r}: expected NCCL_NAME=VALUE (NCCL_, GLOO_, TORCH_, CUDA_, UCX_, FI_)")
        env.append((name, value))
    sizes = get("sizes")
    from app.gpu.options import GpuTestOptions

    return GpuTestOptions(
        python=get("python"), backend=get("backend", "auto") or "auto", timeout=get("test_timeout", 60.0),
        startup_timeout=get("startup_timeout", 180.0), procs_per_node=get("procs_per_node"),
        sizes=sizes_arg(sizes) if isinstance(sizes, str) else sizes, warmup=get("warmup", 5),
        iters=get("iters", 20), pair_size=get("pair_size"),
        slow_ratio=get("slow_ratio", 0.5), min_busbw=get("min_busbw"), all_pairs=bool(get("all_pairs")),
        gpu_pairs=not get("no_gpu_pairs"), nccl_debug=not get("no_nccl_debug"), env=tuple(env),
        targets=tuple(_target(t) for t in get("target", []) or []), master_addr=get("master_addr"),
        allow_busy_gpus=bool(get("allow_busy_gpus")))


def results_to_json(results: GpuTestResults) -> str:
    from app.model.codec import to_dict

    return json.dumps({"schema": SCHEMA, "schema_version": 1, "results": to_dict(results)}, indent=1,
                      ensure_ascii=False)


class _Progress:
    """One stderr line per run and per round, so a long test shows that it is alive."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def __call__(self, event: Any) -> None:
        from app.gpu import events as ev
        from app.gpu.table import printable

        if isinstance(event, ev.RoundStarted):
            tests = " ".join("+".join(t) for t in event.tests)
            what = "each alone" if all(len(t) == 1 for t in event.tests) else f"round {event.index}"
            line = f"{event.scope}: {what}: {tests}"
        elif isinstance(event, ev.RunStarted):
            line = f"{event.run_id}: started on {', '.join(event.nodes)} (master {event.master}:{event.port})"
        elif isinstance(event, ev.RunFinished):
            line = f"{event.run.id}: {event.run.status} in {event.run.elapsed:.1f} s"
        elif isinstance(event, ev.Note):
            line = event.text
        else:
            return
        self.stream.write("hangscope: " + printable(line) + "\n")
        self.stream.flush()


def run_tests_headless(hosts: Optional[Sequence[Any]], kind: TestKind, options: GpuTestOptions, *,
                       session_options: Any = None, json_path: Optional[str] = None, force: bool = False,
                       quiet: bool = False, out: TextIO = sys.stdout, err: TextIO = sys.stderr,
                       inputs: Sequence[str] = ()) -> tuple[GpuTestResults, int]:
    """Connect, run one test, print its table (and JSON to json_path, never over one of `inputs`); hosts None:
    this machine."""
    from app.cli.run import run_interruptible, write_private
    from app.gpu.connect import GpuWorkers
    from app.gpu.model import GpuTestResults
    from app.gpu.runner import GpuTestRunner
    from app.gpu.table import format_table
    from app.session import SessionOptions

    if kind not in KINDS:
        raise InputError(f"--test must be one of {', '.join(KINDS)}")
    holder: dict[str, Any] = {}

    def cancel() -> None:
        runner = holder.get("runner")
        if runner is not None:
            runner.cancel()

    async def main() -> GpuTestResults:
        sopts = session_options or SessionOptions(python=options.python)
        workers = GpuWorkers(hosts, sopts)
        await workers.open()
        try:
            runner = holder["runner"] = GpuTestRunner(workers.conns, options, None if quiet else _Progress(err),
                                                      workers.errors)
            return await runner.run(kind)
        finally:
            await workers.close()

    results = run_interruptible(main, cancel)
    assert isinstance(results, GpuTestResults)
    out.write(format_table(results) + "\n")
    out.flush()
    if json_path:
        write_private(json_path, results_to_json(results), force=force, inputs=inputs, flag="--json")
        err.write(f"hangscope: results written to {json_path}\n")
    if results.interrupted:
        return results, EXIT_INTERRUPTED
    return results, EXIT_OK if results.ok else EXIT_PROBLEM
