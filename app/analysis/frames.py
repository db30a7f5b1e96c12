"""What a frame means to the analysis: its identity, Python machinery to fold away, torch collectives, display.

Frames and every string in them are remote text: `clean` makes them printable before any of it is shown.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable, Literal, Optional, Sequence, Tuple

from app.analysis.sites import native_site
from app.model import Frame
from app.printable import clean

Identity = Literal["function", "function+line"]
FrameId = Tuple[str, str, int]  # (function, filename, line); line 0 when the identity ignores lines

# Python's own plumbing between the interpreter and user code: the same on every rank, and only noise in a
# merged tree. (filename suffix, function names or None for all); py-spy reports frozen modules as
# "<frozen runpy>" and sources as ".../runpy.py".
_MACHINERY: Tuple[Tuple[Tuple[str, ...], Optional[frozenset]], ...] = (
    (("<frozen importlib._bootstrap>", "<frozen importlib._bootstrap_external>",
      "importlib/_bootstrap.py", "importlib/_bootstrap_external.py"), None),
    (("threading.py",), frozenset({"_bootstrap", "_bootstrap_inner", "run"})),
    (("<frozen runpy>", "runpy.py"), frozenset({"_run_module_as_main", "_run_code"})),
    (("torch/distributed/elastic/multiprocessing/errors/__init__.py",), frozenset({"wrapper"})),
)


@lru_cache(maxsize=8192)  # the same few hundred frames recur on every path
def is_machinery(function: str, filename: str) -> bool:
    """True for frames of importlib's bootstrap, thread start-up, runpy and torch elastic's error wrapper."""
    name = filename.replace("\\", "/")
    short = bare_name(function)
    for suffixes, functions in _MACHINERY:
        if name.endswith(suffixes) and (functions is None or short in functions):
            return True
    return False


def bare_name(function: str) -> str:
    """py-spy 0.4 reports qualified names (`Thread.run`, `_exception_logger.<locals>.wrapper`): the last part."""
    return function.rsplit(".", 1)[-1]


# A native frame without a symbol is named by its address, which differs per process (ASLR).
_ADDRESS_NAME = re.compile(r"0x[0-9a-fA-F]+\Z")


def frame_id(frame: Frame, identity: Identity) -> FrameId:
    """What makes two frames the same: function, file and (for "function+line") line; unsymbolised native
    frames are the same when they are in the same library, whatever their address."""
    function = frame.function
    if frame.native and _ADDRESS_NAME.match(function):
        function = "??"
    return (function, frame.filename, frame.line if identity == "function+line" else 0)


# torch.distributed's Python API, by function name -> the collective a user knows it as.
_PY_COLLECTIVES = {
    "all_reduce": "all_reduce", "all_reduce_coalesced": "all_reduce", "all_reduce_multigpu": "all_reduce",
    "all_gather": "all_gather", "all_gather_into_tensor": "all_gather", "_all_gather_base": "all_gather",
    "all_gather_object": "all_gather", "all_gather_coalesced": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather",
    "reduce_scatter": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter", "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "broadcast": "broadcast", "broadcast_object_list": "broadcast",
    "barrier": "barrier", "_store_based_barrier": "barrier", "monitored_barrier": "monitored_barrier",
    "send": "send", "isend": "send", "send_object_list": "send",
    "recv": "recv", "irecv": "recv", "recv_object_list": "recv", "batch_isend_irecv": "send/recv",
    # torch.distributed.pipelining's schedules wait for a stage's batched sends and receives here
    "_wait_batch_p2p": "send/recv",
    "all_to_all": "all_to_all", "all_to_all_single": "all_to_all",
    # torch 2.13's single-tensor forms (FSDP2 calls reduce_scatter_single in its post-backward)
    "all_gather_single": "all_gather", "reduce_scatter_single": "reduce_scatter",
    "all_gather_single_coalesced": "all_gather", "reduce_scatter_single_coalesced": "reduce_scatter",
    # functional collectives (torch.distributed._functional_collectives: DTensor's redistribution, FSDP2's state
    # dicts, tensor parallel): issued async, the thread waits for the result in `wait_tensor`, which a stack shows
    # under the API that needed it (`DTensor.redistribute`); the collective itself is in that API's name only
    "wait_tensor": "wait_tensor", "all_gather_tensor": "all_gather", "all_gather_tensor_autograd": "all_gather",
    "reduce_scatter_tensor_autograd": "reduce_scatter", "all_to_all_single_autograd": "all_to_all",
    "all_gather_single_autograd": "all_gather", "reduce_scatter_single_autograd": "reduce_scatter",
    "reduce": "reduce", "gather": "gather", "gather_object": "gather",
    "scatter": "scatter", "scatter_object_list": "scatter",
    # creating a group is collective too: every rank of the world calls it, in the same order; the default group
    # is made by init_process_group (its rendezvous, then the same helper new_group runs): the call the user made
    "init_process_group": "init_process_group",
    "new_group": "new_group", "_new_group_with_tag": "new_group", "_new_process_group_helper": "new_group",
    "new_subgroups": "new_group", "new_subgroups_by_enumeration": "new_group", "split_group": "new_group",
}

# c10d / gloo / NCCL native names, lower-cased with underscores removed; the most specific first. Short
# tokens must start the last name component: gloo's `UnboundBuffer::waitRecv` is inside an all_reduce too.
_NATIVE_TOKENS = (
    ("monitoredbarrier", "monitored_barrier", False), ("allreduce", "all_reduce", False),
    ("allgather", "all_gather", False), ("reducescatter", "reduce_scatter", False),
    ("alltoall", "all_to_all", False), ("broadcast", "broadcast", False), ("barrier", "barrier", False),
    ("send", "send", True), ("recv", "recv", True), ("gather", "gather", True),
    ("scatter", "scatter", True), ("reduce", "reduce", True),
)
_NATIVE_NAMESPACES = ("c10d::", "gloo::", "nccl")


def collective_of(frame: Frame) -> Optional[str]:
    """The torch.distributed collective a frame is part of (`all_reduce`, `barrier`, ...), or None."""
    return _collective(frame.function, frame.filename, frame.native)


@lru_cache(maxsize=8192)
def _collective(function: str, filename: str, native: bool) -> Optional[str]:
    if native or not filename.endswith(".py"):
        name = function.replace("(anonymous namespace)", "").split("(", 1)[0].lower()
        if not any(ns in name for ns in _NATIVE_NAMESPACES):
            return None
        if "c10d::reducer::" in name:
            return "all_reduce"  # DDP's Reducer: the gradient buckets' all_reduce, run from autograd's engine
        last = name.rsplit("::", 1)[-1].replace("_", "")
        for token, collective, prefix_only in _NATIVE_TOKENS:
            if last.startswith(token) if prefix_only else token in last:
                return collective
        return None
    path = filename.replace("\\", "/")
    if path.endswith(_DDP_FILE):
        return _DDP_COLLECTIVES.get(bare_name(function))
    if "torch/distributed/" not in path:
        return None  # a user function named `broadcast` is not torch's
    return _PY_COLLECTIVES.get(bare_name(function))


# DistributedDataParallel's own collectives, run from its Python code: the buffers' broadcast from rank 0 at the
# start of every forward (broadcast_buffers=True, the default), and the parameters' broadcast and the shapes' check
# when the model is wrapped. Its gradient all_reduce runs from autograd's C++ engine instead (in_backward).
_DDP_FILE = "torch/nn/parallel/distributed.py"
_DDP_COLLECTIVES = {
    "_sync_buffers": "broadcast", "_sync_module_buffers": "broadcast", "_default_broadcast_coalesced": "broadcast",
    "_distributed_broadcast_coalesced": "broadcast", "_sync_params_and_buffers": "broadcast",
    "_verify_params_across_processes": "all_gather",
}


def ddp_forward(frames: Sequence[Frame]) -> bool:
    """Whether a path is in DDP's forward (its buffers' broadcast runs there)."""
    return any(f.filename.replace("\\", "/").endswith(_DDP_FILE) and bare_name(f.function) in ("forward", "_pre_forward")
               for f in frames)


_GROUP_ARG = re.compile(r"\bgroup\s*=\s*([^,()]+(?:\([^()]*\))?)")


def group_arg(f: Optional[Frame]) -> str:
    """The `group=` argument of the collective call on a frame's current line ("" for the default group)."""
    text = dict(f.source).get(f.line, "") if f is not None else ""
    m = _GROUP_ARG.search(text)
    return m.group(1).strip() if m else ""


def path_collective(frames: Sequence[Frame]) -> Tuple[Optional[str], Optional[Frame]]:
    """The collective a path waits in and its frame: the outermost one, which is the call the user made
    (barrier() runs an all_reduce inside some backends; the user wrote barrier); else the operation whose
    asynchronous handle its innermost Python frame waits on (handle_wait), with that frame."""
    for frame in frames:  # outermost first
        name = collective_of(frame)
        if name is not None:
            return name, frame
    inner = next((f for f in reversed(frames) if not f.native), None)
    if inner is not None:
        found = handle_wait(inner)
        if found is not None:
            return found.op, inner
    return None, None


@dataclass(frozen=True)
class HandleWait:
    """A thread waiting on the handle of an asynchronous torch.distributed operation (`req.wait()` on the c10d
    Work that `isend`, `irecv`, `batch_isend_irecv` or a collective with `async_op=True` returned): it waits in
    that operation, though its stack shows no torch.distributed frame (the handle's wait is C++)."""

    op: str  # as _PY_COLLECTIVES names it: "send", "recv", "send/recv", "all_reduce", ...
    receiver: str  # the handle's expression: `req`, `self._pending[0]`
    maker: str  # the text of the line that made it, stripped ("" when made on the waiting line itself)
    maker_line: int  # its line number


# `h.wait()`, `self.work.wait(timeout)`, `dist.isend(t, 1).wait()`: the receiver, then `.wait(`
_WAIT_CALL = re.compile(r"([A-Za-z_][\w.]*(?:\[[^\]]*\])?|\))\s*\.\s*wait\s*\(")
_WORK = re.compile(r"(?:^|[<\s.\[(])Work\b")  # a local's repr: `<torch._C._distributed_c10d.Work at 0x..>`, a list
_CALL_NAME = re.compile(r"\b([A-Za-z_]\w*)\s*(?=\(|,|\))")
_ASYNC_ONLY = frozenset({"isend", "irecv", "batch_isend_irecv"})  # return a handle whatever their arguments
DEF_LINE = re.compile(r"\s*(?:async\s+)?def\s")  # a function's own start: what is above it is not its code
MAX_MAKER_LINES = 12  # how far above the wait the call that made the handle is looked for (a frame's source)


def handle_wait(frame: Frame) -> Optional[HandleWait]:
    """The asynchronous operation a frame's current line waits on, when the line is a `.wait()` on a c10d Work
    handle and the call that made it is on that line or above it in the same function (within the source the
    node sent). The handle is known as one by its local's repr (a Work), or, without locals, by the call that
    made it: isend, irecv and batch_isend_irecv always return one, a collective only with `async_op=True`."""
    if frame.native or not frame.source:
        return None
    return _handle_wait(frame.line, frame.source, tuple((x.name, x.repr) for x in frame.locals))


@lru_cache(maxsize=4096)
def _handle_wait(line: int, source: Tuple[Tuple[int, str], ...],
                 local_reprs: Tuple[Tuple[str, str], ...]) -> Optional[HandleWait]:
    lines = dict(source)
    text = lines.get(line, "").split("#", 1)[0]
    m = _WAIT_CALL.search(text)
    if m is None:
        return None
    receiver = m.group(1)
    head = receiver.split(".", 1)[0].split("[", 1)[0]
    is_work = any(name == head and _WORK.search(value) for name, value in local_reprs)
    here = text[:m.start()] if receiver == ")" else ""
    candidates = [(line, here)] if here else []
    for n in range(line - 1, max(line - MAX_MAKER_LINES, 0) - 1, -1):
        above = lines.get(n)
        if above is None:
            break
        candidates.append((n, above.split("#", 1)[0]))
        if DEF_LINE.match(above):
            break  # the function's own start: nothing above made this handle
    made = []
    for n, code in candidates:
        names = [x for x in _CALL_NAME.findall(code) if x in _PY_COLLECTIVES]
        if not names:
            continue
        ops = {_PY_COLLECTIVES[x] for x in names}
        if not (is_work or "async_op" in code or any(x in _ASYNC_ONLY for x in names)):
            continue
        op = "send/recv" if ops >= {"send", "recv"} or "send/recv" in ops else sorted(ops)[0]
        made.append(HandleWait(op, "" if receiver == ")" else receiver, "" if n == line else code.strip(), n))
    # the line that names the handle (`send = dist.isend(...)`, `for req in dist.batch_isend_irecv(ops):`) made it;
    # else the nearest such call above
    bound = re.compile(rf"(?:^|[\s,(])(?:for\s+)?{re.escape(head)}\s*(?:=(?!=)|\bin\b)") if head else None
    return next((h for h in made if bound is not None and bound.search(h.maker)), made[0] if made else None)


# Autograd's entry points: a rank of a DDP job waits in them for its gradient all_reduce (the Reducer runs it
# from autograd's C++ engine, under `Tensor.backward`, where no torch.distributed Python frame shows).
_BACKWARD = (("torch/_tensor.py", "backward"), ("torch/autograd/__init__.py", "backward"),
             ("torch/autograd/graph.py", "_engine_run_backward"))


def in_backward(frames: Sequence[Frame]) -> bool:
    """Whether a path runs autograd's backward (a Python frame of torch's, or the C++ engine natively)."""
    for frame in frames:
        name = frame.filename.replace("\\", "/")
        if any(name.endswith(f) and bare_name(frame.function) == fn for f, fn in _BACKWARD):
            return True
        if frame.native and "torch::autograd::engine" in frame.function.lower():
            return True
    return False


def ddp_reducer(frames: Sequence[Frame]) -> bool:
    """Whether a native path shows DDP's Reducer (c10d::Reducer), which runs the gradient all_reduce."""
    return any(frame.native and "c10d::Reducer::" in frame.function for frame in frames)


_LIBRARY = re.compile(r"/(site|dist)-packages/|/lib/python\d|^<frozen |^<built-in")


def library_file(filename: str) -> bool:
    """A file of an installed package or of the standard library (or the interpreter's own), not the job's."""
    return bool(_LIBRARY.search(filename.replace("\\", "/")))


def is_library(frame: Frame) -> bool:
    """Frames of installed packages, the standard library and native code, as opposed to the job's code."""
    return frame.native or library_file(frame.filename)


def focus_frame(frames: Sequence[Frame]) -> Optional[Frame]:
    """The innermost frame of the job's own code on an outermost-first path (else the innermost frame)."""
    for frame in reversed(frames):
        if not is_library(frame):
            return frame
    return frames[-1] if frames else None


def location(frame: Frame) -> str:
    return clean(frame.location, 120)


def frame_text(frame: Frame) -> str:
    """`all_reduce (distributed_c10d.py:2950)`, printable."""
    return f"{clean(frame.function, 80)} ({location(frame)})"


def named(frame: Frame) -> str:
    """`` `all_reduce` (distributed_c10d.py:2950) ``: a frame inside a sentence."""
    return f"`{clean(frame.function, 80)}` ({location(frame)})"


_ADDRESS = re.compile(r"0x[0-9a-fA-F]+|\?*|<unknown>")


def unnamed(f: Frame) -> bool:
    """A native frame without a symbol: an address inside a library (a stripped driver), not a place."""
    return f.native and _ADDRESS.fullmatch(f.function.strip()) is not None


def wait_end(frames: Sequence[Frame]) -> int:
    """How many of the outermost-first frames say where the thread is: the innermost native frames from the
    outermost native wait the tables name (cudaDeviceSynchronize, a TCPStore wait) inward are that wait's own
    machinery (a driver polling the GPU, a spin loop), caught somewhere else in every sample and in every rank."""
    end = len(frames)
    for i in range(len(frames) - 1, -1, -1):
        if not frames[i].native:
            break  # only the native frames innermost of the Python ones are the call in progress
        if native_site(frames[i].function) is not None:
            end = i + 1
    return end


def place_frames(frames: Sequence[Frame]) -> Tuple[Frame, ...]:
    """The frames (innermost first) that say where a thread is, for telling samples and ranks apart: Python
    frames and named native frames, up to the native wait they are in (wait_end), never a bare address."""
    outer = tuple(reversed(frames))
    return tuple(f for f in reversed(outer[:wait_end(outer)]) if not unnamed(f))


def fold_path(frames: Iterable[Frame], *, native: bool, fold_machinery: bool) -> Tuple[int, ...]:
    """Indices (into the given outermost-first frames) of the frames the analysis keeps (native ones: as
    place_frames keeps them)."""
    frames = tuple(frames)
    end = wait_end(frames) if native else len(frames)
    kept = []
    for i, f in enumerate(frames[:end]):
        if f.native and (not native or unnamed(f)):
            continue
        if fold_machinery and is_machinery(f.function, f.filename):
            continue
        kept.append(i)
    return tuple(kept)
