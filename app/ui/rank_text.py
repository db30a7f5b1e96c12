"""One rank's data as rich Text, one function per drill-down tab. No Textual: rich.text only, remote text
always through app.ui.safe so it is shown literally."""

from __future__ import annotations

from typing import List, Optional, Sequence

from rich.text import Text

from app.analysis.output import age_text
from app.model import Frame, RankSnapshot, ThreadStack
from app.ui.safe import NAME_LIMIT, VALUE_LIMIT, clean, gdb_lines, lines, literal, run_name

DIM = "dim"
HEAD = "bold"
NATIVE = "#87afd7"
CURRENT = "bold reverse"


def frame_line(frame: Frame, *, width_hint: int = 40) -> Text:
    """`function  file.py:line  [step=5]` with native frames told apart."""
    out = Text(no_wrap=True, overflow="ellipsis", end="")
    out.append_text(literal(frame.function or "?", NAME_LIMIT, NATIVE if frame.native else "bold"))
    out.append("  ")
    where = frame.location if not frame.native else (frame.module or frame.filename or "?")
    out.append_text(literal(where, NAME_LIMIT, DIM))
    if frame.iteration:
        it = ", ".join(f"{clean(k, 40)}={clean(v, 40)}" for k, v in frame.iteration)
        out.append("  [", style="#ffaf00")
        out.append(it, style="#ffaf00")
        out.append("]", style="#ffaf00")
    if frame.native:
        out.append("  native", style=NATIVE)
    return out


def thread_header(t: ThreadStack) -> Text:
    out = Text(end="")
    out.append(f"thread {t.tid}", style=HEAD)
    if t.name:
        out.append(" ")
        out.append_text(literal(run_name(t.name), 60))
    flags = [f for f, on in (("main", t.is_main), ("active", t.active), ("holds GIL", t.owns_gil)) if on]
    if flags:
        out.append(f"  ({', '.join(flags)})", style=DIM)
    proc = [f"{k} {clean(v, 40)}" for k, v in (("state", t.state), ("wchan", t.wchan), ("syscall", t.syscall)) if v]
    if proc:
        out.append("  " + "  ".join(proc), style=DIM)
    return out


def ordered_threads(rank: RankSnapshot) -> List[ThreadStack]:
    """The main thread first, the others as collected: the same order in every tab."""
    return sorted(rank.threads, key=lambda t: not t.is_main)


def threads_text(rank: RankSnapshot) -> Text:
    if not rank.threads:
        return _missing(rank, "no stacks")
    out = Text(end="")
    for i, t in enumerate(ordered_threads(rank)):
        if i:
            out.append("\n\n")
        out.append_text(thread_header(t))
        if not t.frames:
            out.append("\n  (no Python frames: idle or native-only thread)", style=DIM)
        for f in t.frames:
            out.append("\n  ")
            out.append_text(frame_line(f))
    return out


def locals_text(rank: RankSnapshot, collected: bool = False) -> Text:
    """collected: the snapshot was taken with locals (then there is nothing to advise, only to say)."""
    out = Text(end="")
    for t in ordered_threads(rank):
        for f in t.frames:
            if not f.locals:
                continue
            if out:
                out.append("\n\n")
            out.append_text(literal(f"{f.function} ({f.location})", NAME_LIMIT, HEAD))
            out.append(f"  thread {t.tid}", style=DIM)
            if f.iteration:
                out.append("  iteration " + ", ".join(f"{clean(k, 40)}={clean(v, 40)}" for k, v in f.iteration),
                           style="#ffaf00")
            width = min(max(len(clean(v.name, 30)) for v in f.locals), 30)
            for v in f.locals:
                out.append("\n  ")
                out.append_text(literal(clean(v.name, 30).ljust(width), None, "#5fafff" if v.arg else ""))
                out.append(" = ")
                out.append_text(literal(v.repr, VALUE_LIMIT))
                if f.function == "<module>":  # a module's locals are its globals (read from memory)
                    out.append("  (global)", style=DIM)
    if not out:
        if collected:
            return Text("No local variables were readable in this rank's frames (collected with locals).",
                        style=DIM)
        return Text("No locals collected. Collect with locals (key L, or --locals) to see loop variables.",
                    style=DIM)
    return out


def source_text(rank: RankSnapshot) -> Text:
    out = Text(end="")
    for t in ordered_threads(rank):
        for f in t.frames:
            if not f.source:
                continue
            if out:
                out.append("\n\n")
            out.append_text(literal(f"{f.filename}:{f.line}  in {f.function}", NAME_LIMIT, HEAD))
            for number, code in f.source:
                out.append("\n")
                mark = "→" if number == f.line else " "
                style = CURRENT if number == f.line else ""
                out.append(f"{mark}{number:>6} ", style=DIM if number != f.line else "bold")
                out.append_text(literal(code, 300, style))
    if not out:
        return Text("No source lines: the files were not readable on the node, or this is a /proc-only view.",
                    style=DIM)
    return out


def strace_text(rank: RankSnapshot) -> Text:
    s = rank.strace
    if s is None:
        return Text("Not collected. Press s to strace this rank (it is traced for a few seconds).", style=DIM)
    out = Text(f"strace for {s.seconds:g} s", style=HEAD, end="")
    for th in s.threads:
        out.append(f"\n  thread {th.tid}: {th.calls} calls", style="")
        if th.blocked_in:
            out.append("  blocked in ")
            out.append_text(literal(th.blocked_in, NAME_LIMIT, "bold"))
        if th.top:
            out.append("  top: " + ", ".join(f"{clean(n, 30)}×{c}" for n, c in th.top), style=DIM)
    out.append("\n\n")
    out.append_text(lines(s.output))
    if s.truncated:
        out.append("\n… output truncated on the node", style=DIM)
    return out


def gdb_text(rank: RankSnapshot) -> Text:
    if rank.gdb is None:
        return Text("Not collected. Press g for a gdb backtrace of this rank (stops it ~3 s).", style=DIM)
    return gdb_lines(rank.gdb)


def proc_text(rank: RankSnapshot, family: Sequence[str] = ()) -> Text:
    """The process: /proc facts, its place in the job (`family`: analysis.processes.rank_family, launchers
    above and children below), each thread's kernel stack, its TCP connections."""
    out = Text(end="")
    rows = [("pid", str(rank.pid)), ("ppid", str(rank.ppid or "")), ("state", rank.state),
            ("wchan", rank.wchan), ("threads", str(rank.num_threads)), ("cpu time", f"{rank.cpu_time:.2f} s"),
            ("rss", f"{rank.rss / 2**20:.0f} MiB"), ("user", f"{rank.user} ({rank.uid})" if rank.uid is not None
                                                    else rank.user),
            ("exe", rank.exe), ("pid in its namespace", str(rank.nspid or "")),
            ("in a container", "yes" if rank.in_container else ""),
            ("helper processes", " ".join(map(str, rank.children))),
            ("resumed by hangscope", "yes: it was found stopped after a tool" if rank.resumed else "")]
    for gpu in rank.gpus:
        rows.append((f"gpu {gpu.index if gpu.index is not None else '?'}",
                     f"{gpu.name} {gpu.uuid} {gpu.used_mib or '?'} MiB"))
    _table(out, rows)
    if family:
        out.append("\n\nIn the job (launchers above, children below)", style=HEAD)
        for line in family:
            out.append("\n  ")
            out.append_text(literal(line, 300, "bold" if line.endswith("(this rank)") else ""))
    if rank.actions or rank.notes:  # what hangscope did to it, and what it left undone and why
        out.append("\n\nWhat hangscope did to it", style=HEAD)
        for line in rank.actions:
            out.append("\n  ")
            out.append_text(literal(line, 300))
        for line in rank.notes:
            out.append("\n  ")
            out.append_text(literal(line, 500, DIM))
    for o in rank.output:  # what it wrote of an error where its node could read it (redacted there)
        what = "elastic error file" if o.source == "error_file" else "stderr"
        out.append(f"\n\nRecent error output: its {what}", style=HEAD)
        out.append_text(literal(f" ({o.path}{', ' + age_text(o.age) if o.age is not None else ''})", 600, DIM))
        for line in o.text.splitlines()[:40]:
            out.append("\n  ")
            out.append_text(literal(line, 400, "#ff8787"))
    for t in ordered_threads(rank):
        out.append("\n")
        out.append_text(thread_header(t))
        for frame in t.kernel_stack[:20]:
            out.append("\n    ")
            out.append_text(literal(frame, NAME_LIMIT, DIM))
    if rank.sockets:
        out.append("\n\nTCP connections", style=HEAD)
        for s in rank.sockets:
            out.append("\n  ")
            out.append_text(literal(f"{s.local} → {s.peer}  {s.state}  send-q {s.send_q}  recv-q {s.recv_q}", 200))
            if s.retransmits or s.backoff:
                out.append(f"  retransmits {s.retransmits}  backoff {s.backoff}", style="bold #ff5f5f")
    return out


def env_text(rank: RankSnapshot) -> Text:
    out = Text("command line (redacted on the node)", style=HEAD, end="")
    out.append("\n  ")
    out.append_text(literal(" ".join(rank.cmdline) or "?", 4000))
    out.append("\n\n")
    _table(out, [("launcher", f"{rank.launcher} (pid {rank.launcher_pid})" if rank.launcher_pid else rank.launcher),
                 ("rank", _opt(rank.rank)), ("local rank", _opt(rank.local_rank)),
                 ("world size", _opt(rank.world_size)), ("group rank", _opt(rank.group_rank)),
                 ("master", f"{rank.master_addr}:{rank.master_port}" if rank.master_addr else "")])
    out.append("\n\nenvironment (allowlisted names only)", style=HEAD)
    for k, v in rank.env:
        out.append("\n  ")
        out.append_text(literal(k, 60, "#5fafff"))
        out.append("=")
        out.append_text(literal(v, VALUE_LIMIT))
    return out


def rank_title(rank: RankSnapshot, extra: str = "") -> Text:
    out = Text(end="")
    out.append(rank.label, style=HEAD)
    out.append("  on ")
    out.append_text(literal(rank.node, 60))
    out.append(f"  pid {rank.pid}")
    if extra:
        out.append("  " + extra)
    if rank.partial:
        out.append("  partial", style="bold #ffaf00")
    if rank.error is not None:
        out.append("  ")
        out.append_text(literal(f"{rank.error.code}: {rank.error.message}", 200, "bold #ff5f5f"))
    return out


def _opt(v: Optional[int]) -> str:
    return "" if v is None else str(v)


def _table(out: Text, rows: List[tuple]) -> None:
    rows = [(k, v) for k, v in rows if v]
    width = max((len(k) for k, _ in rows), default=0)
    for i, (k, v) in enumerate(rows):
        if i:
            out.append("\n")
        out.append(k.ljust(width) + "  ", style=DIM)
        out.append_text(literal(v, VALUE_LIMIT))


def _missing(rank: RankSnapshot, what: str) -> Text:
    if rank.error is not None:
        out = Text(f"{what}: ", end="")
        out.append_text(literal(rank.error.message, 300, "bold"))
        if rank.error.hint:
            out.append("\nwhat to do: ")
            out.append_text(literal(rank.error.hint, 600))
        return out
    return Text(f"{what} (not collected yet)", style=DIM)
