"""Stacks: frames with their locals, loops and `with` blocks, threads, and the interned path of a thread's frames
(ThreadStack.path) that the analysis groups ranks by."""

from __future__ import annotations

import sys
import typing
from dataclasses import dataclass
from operator import attrgetter
from typing import Literal, Optional, Tuple

from app.model.kwait import KernelWait
from app.model.memo import BoundedMemo
from app.model.process import ProcState


@dataclass(frozen=True)
class Local:
    """One local variable as py-spy shows it (repr is remote text: display literally)."""

    name: str
    repr: str
    arg: bool = False
    # A `<module>` frame's locals are its module's globals: py-spy shows none there, and the worker reads the
    # module-level loop's variables and counters of __main__ from the rank's memory (workers/collect/pyglobals.py).


@dataclass(frozen=True)
class LoopInfo:
    """A loop that encloses a frame's current line, found by the worker from the frame's source (ast)."""

    kind: Literal["for", "async for", "while"]
    line: int  # the loop header's line
    end_line: int
    header: str  # the loop header as written, e.g. "for step, batch in enumerate(loader):"
    variables: Tuple[str, ...] = ()  # names bound by the loop target: ("step", "batch")
    counters: Tuple[str, ...] = ()  # names incremented in the body: i += 1


@dataclass(frozen=True)
class WithInfo:
    """A `with` block around a frame's current line (from the frame's source, like LoopInfo): the frame holds its
    context managers, or waits to enter it when the current line is the statement's header (`entering`)."""

    line: int
    end_line: int
    header: str  # as written, e.g. "with _metrics_lock:"
    items: Tuple[str, ...] = ()  # each context manager's expression: ("_metrics_lock",)
    entering: bool = False


# Frames are the model's most numerous objects where ranks keep locals of their own (60 a rank in a deep stack,
# issue 27): with slots a frame is ~110 bytes, without ~160 built by __init__ and ~220 built without it
# (app/decode/build.py: reading __dict__ gives the instance a dict object of its own). Python >= 3.10; on 3.9 a
# frame keeps its dict. RankSnapshot (app/model/rank.py) takes the same.
SLOTS: dict = {"slots": True} if sys.version_info >= (3, 10) else {}


@dataclass(frozen=True, **SLOTS)
class Frame:
    """One stack frame. Python frames carry locals and loops when collected; native frames carry a module."""

    function: str
    filename: str
    line: int
    module: Optional[str] = None
    native: bool = False
    locals: Tuple[Local, ...] = ()
    loops: Tuple[LoopInfo, ...] = ()  # enclosing loops, outermost first
    # iteration coordinate: (name, value repr) for each loop variable/counter whose value is known,
    # outermost loop first, e.g. (("epoch", "0"), ("step", "1203"))
    iteration: Tuple[Tuple[str, str], ...] = ()
    source: Tuple[Tuple[int, str], ...] = ()  # (line number, text) around the current line, when readable
    withs: Tuple[WithInfo, ...] = ()  # enclosing `with` blocks, outermost first (locks held or being entered)

    @property
    def location(self) -> str:
        short = self.filename.rsplit("/", 1)[-1] if self.filename else "?"
        return f"{short}:{self.line}" if self.line else short


@dataclass(frozen=True)
class ThreadStack:
    """One thread of a rank: py-spy's frames (innermost first) plus what /proc says about it."""

    tid: int
    name: str = ""
    active: bool = False
    owns_gil: bool = False
    frames: Tuple[Frame, ...] = ()  # innermost first, as py-spy prints them
    state: ProcState = ""
    wchan: str = ""
    syscall: str = ""  # first field of /proc/PID/task/TID/syscall, as a syscall name when known
    kernel_stack: Tuple[str, ...] = ()  # /proc/PID/task/TID/stack (root only)
    is_main: bool = False
    # what it waits on when asleep in a system call, and who is at the other end (None: not in such a call, or
    # an older worker); read from /proc on the node, the process never stopped
    waits: Optional[KernelWait] = None
    # user + system seconds it has run (/proc/PID/task/TID/stat): rising by about one per second between samples
    # while it spins on a core; None: not read (an older worker, or no /proc)
    cpu_time: Optional[float] = None

    # `path` is derived, not data: where the thread is, frame by frame (innermost first), without what differs
    # between ranks on the same spot. Each frame appears as a Frame with its function, filename, line, module,
    # native flag and loop iteration values only (no locals, loops or source), and the whole is interned:
    # threads at the same lines in the same loop iteration hold the same tuple object even when their frames
    # differ in locals, which name per-process objects by address. The analysis groups ranks by it with one
    # lookup per rank and reads loop iterations from it once per distinct path (app/analysis/stacks.py).
    # It is set when the stack is built and is not a dataclass field: JSON, the schema, equality and repr never
    # see it, and dataclasses.replace() computes it again. Sharing is an optimisation only: equal paths may be
    # distinct objects (after the intern tables start over, or after unpickling).
    # `enters_with`, derived the same way: the thread stands at a `with` header in one of its three innermost
    # Python frames (it may be waiting for a lock; app/analysis/locks.py reads it, and only then the frames).
    if typing.TYPE_CHECKING:  # declared for type checkers only: at run time plain instance attributes
        @property
        def path(self) -> Tuple[Frame, ...]: ...

        @property
        def enters_with(self) -> bool: ...

    def __post_init__(self) -> None:
        frames = self.frames
        known = _SHARED.get(id(frames))
        if known is not None and known[0] is frames:  # frames many threads share (share()): derived once
            object.__setattr__(self, "path", known[1])
            object.__setattr__(self, "enters_with", known[2])
            return
        object.__setattr__(self, "path", frame_path(frames))
        object.__setattr__(self, "enters_with", _enters_with(frames))


# Frames tuples that many threads share (the compact protocol's stacks, app/decode/replies.py), by id, with what
# ThreadStack derives from them: building a thread on one of them then costs a lookup, not a walk of its frames.
# Each entry holds its tuple, so an id is never reused while it is in the table.
_SHARED: BoundedMemo[int, Tuple[Tuple[Frame, ...], Tuple[Frame, ...], bool]] = BoundedMemo(1 << 16)


def share(frames: Tuple[Frame, ...]) -> Tuple[Frame, ...]:
    """Mark a frames tuple as shared by many threads: ThreadStack reads its path from here."""
    if _SHARED.get(id(frames)) is None:  # an entry holds its tuple: an id in the table is that tuple's
        _SHARED.add(id(frames), (frames, frame_path(frames), _enters_with(frames)))
    return frames


def _enters_with(frames: Tuple[Frame, ...]) -> bool:
    n = 0
    for f in frames:
        if f.native:
            continue
        if f.withs and any(w.entering for w in f.withs):
            return True
        n += 1
        if n == 3:
            return False
    return False


# Interned paths. Built here, where the frames were just made (and sit in the CPU cache), rather than in the
# analysis, which would read 6M scattered frames again at 100k ranks x 60 frames (bench/analysis.py). The
# table is keyed column by column (six tuples, no tuple per frame).
_PATH_FIELDS = ("function", "filename", "line", "module", "native", "iteration")
_COLUMNS = tuple(map(attrgetter, _PATH_FIELDS))
# Frames over all interned paths before the path table starts over (~100 bytes each), and bare frames before
# theirs does (app/model/memo.py): a snapshot holds a few hundred distinct paths.
MAX_INTERNED_FRAMES = 1 << 18
_PATHS: BoundedMemo[tuple, Tuple[Frame, ...]] = BoundedMemo(MAX_INTERNED_FRAMES)
_BARE: BoundedMemo[tuple, Frame] = BoundedMemo(MAX_INTERNED_FRAMES)


def frame_path(frames: Tuple[Frame, ...]) -> Tuple[Frame, ...]:
    """The interned path of these frames (ThreadStack.path): the same tuple object for equal positions."""
    if not frames:
        return ()
    key = tuple(tuple(map(get, frames)) for get in _COLUMNS)
    path = _PATHS.get(key)
    return path if path is not None else _intern(key)


def _intern(key: tuple) -> Tuple[Frame, ...]:
    """A new path in the tables. The memo's setdefault keeps concurrent builders (the session's threads)
    consistent: the first to arrive wins and the others take its objects; a table starting over in between
    costs sharing, not correctness."""
    bare = []
    for ident in zip(*key):  # (function, filename, line, module, native, iteration)
        frame = _BARE.get(ident)
        if frame is None:
            function, filename, line, module, native, iteration = ident
            frame = _BARE.add(ident, Frame(function, filename, line, module, native, iteration=iteration))
        bare.append(frame)
    return _PATHS.add(key, tuple(bare), weight=len(bare))
