"""Each distinct stack once: a dump item split into what ranks share and what is each rank's own (issue 27).

A node's ranks mostly stand on the same few stacks, and a job's nodes on the same few again; sent whole, every
rank's dump carried its frames, the loops around them and their source lines (~40 KB for a 60-frame stack with
locals). With `compact` (a collect argument) the worker sends:

- per node and connection once, a stack table item {"stacks": {id: entry}}: an entry is a thread's frames
  (py-spy's, without locals), the loops around their lines and their source lines, and its id is the hash of its
  content, so the same stack has the same id on every node and every pass: a relay could pass an id up once for
  all its nodes (not built yet), and a refresh sends no stack the connection has already carried;
- per rank, the dump item without "pyspy", "loops" and "source", with "threads": each thread's tid, name,
  flags, its stack's id, and the locals the login side's analysis reads ("locals": [[frame index, name, repr,
  arg], ...]): loop variables and counters (iterations), arguments whose value is no object address (ranks,
  peers, signal numbers, sizes: the same on many ranks), `self` in threading's frames (who joins whom), and in
  each thread's innermost Python frames the names its current line uses (the receiver of a blocking call).

With the collect argument "all_locals" (the login side asks for it up to app/session's ALL_LOCALS_NODES nodes)
each thread keeps every local instead: a small job shows all of them everywhere, as before the compact form.
The full item stays on the node (Worker.details, the last of each process) for the `detail` op: the TUI's rank
view asks for it, with every local. Stdlib only, Python 3.9.
"""

from __future__ import annotations

import json

try:  # blake2b without hashlib: hashlib loads OpenSSL's libcrypto first (~4 ms of a worker's start, unused)
    from _blake2 import blake2b
except ImportError:  # a Python built without its own blake2
    from hashlib import blake2b

from workers.lazyre import lazy

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Set, Tuple

ID_BYTES = 8  # 16 hex characters: collisions need ~4e9 distinct stacks
MAX_SENT = 1 << 14  # stack ids a connection remembers having sent; past it, it forgets them all (and resends)
OWN_FRAMES = 3  # innermost Python frames per thread whose current line's names are kept
MAX_REPR = 400  # characters of a kept local's repr
_ADDRESS = lazy(r" at 0x[0-9a-fA-F]+>")  # an object named by its address: per process, read by nothing
_NAME = lazy(r"[A-Za-z_][A-Za-z0-9_]*")
_ALWAYS = ("rank", "world_size", "i", "signum", "sig")


def stack_id(entry: Dict[str, Any]) -> str:
    """The id of a stack table entry: a hash of its content (the same stack, the same id, on every node)."""
    text = json.dumps(entry, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return blake2b(text.encode("ascii"), digest_size=ID_BYTES).hexdigest()


def _bare(frame: Dict[str, Any]) -> Dict[str, Any]:
    return {k: v for k, v in frame.items() if k != "locals"}


def _entry(frames: List[Dict[str, Any]], loops: Dict[str, Any], source: Dict[str, Any], context: int
           ) -> Dict[str, Any]:
    """A thread's stack as the table carries it: its frames and only the loops and source lines they show."""
    bare = [_bare(f) for f in frames if isinstance(f, dict)]
    mine_loops: Dict[str, Any] = {}
    mine_source: Dict[str, Dict[str, Any]] = {}
    for f in bare:
        filename, line = f.get("filename"), f.get("line")
        if not isinstance(filename, str) or not isinstance(line, int):
            continue
        key = "%s:%d" % (filename, line)
        if key in loops:
            mine_loops[key] = loops[key]
        text = source.get(filename)
        if isinstance(text, dict) and context >= 0:
            for n in range(max(1, line - context), line + context + 1):
                value = text.get(str(n))
                if value is not None:
                    mine_source.setdefault(filename, {})[str(n)] = value
    return {"frames": bare, "loops": mine_loops, "source": mine_source, "context": context}


def _loop_names(loops: Any) -> Set[str]:
    names: Set[str] = set()
    for lp in loops if isinstance(loops, list) else []:
        if isinstance(lp, dict):
            for key in ("variables", "counters"):
                names.update(v for v in lp.get(key) or [] if isinstance(v, str))
    return names


def _kept(frames: List[Dict[str, Any]], loops: Dict[str, Any], source: Dict[str, Any], everything: bool = False
          ) -> List[List[Any]]:
    """[frame index, name, repr, arg] of the locals the login side reads (see the module's docstring); with
    `everything`, of every local, its repr as py-spy gave it."""
    out: List[List[Any]] = []
    own = 0
    for i, f in enumerate(frames):
        if not isinstance(f, dict):
            continue
        local_vars = f.get("locals")
        raw_file, raw_line = f.get("filename"), f.get("line")
        filename = raw_file if isinstance(raw_file, str) else ""
        line = raw_line if isinstance(raw_line, int) else 0
        on_line: Set[str] = set()
        python = not (f.get("module") or "").strip() and not filename.endswith((".so", ".c", ".cc", ".cpp", ".h"))
        if python and own < OWN_FRAMES:
            own += 1
            lines = source.get(filename)
            text = lines.get(str(line)) if isinstance(lines, dict) else None
            if isinstance(text, str):
                on_line = set(_NAME.findall(text))
        if not isinstance(local_vars, list) or not local_vars:
            continue
        wanted = _loop_names(loops.get("%s:%d" % (filename, line)))
        threading_frame = filename.endswith("threading.py")
        for lc in local_vars:
            if not isinstance(lc, dict) or not isinstance(lc.get("name"), str):
                continue
            name, value, arg = lc["name"], lc.get("repr"), lc.get("arg") is True
            if not isinstance(value, str):
                value = ""
            if everything:
                out.append([i, name, value, arg])
                continue
            keep = (name in wanted or name in on_line or name in _ALWAYS
                    or (name == "self" and threading_frame)
                    or (arg and _ADDRESS.search(value) is None))
            if keep:
                out.append([i, name, value[:MAX_REPR], arg])
    return out


def split(item: Dict[str, Any], sent: Set[str], all_locals: bool = False) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """(the rank's compact item, the stack table entries this connection has not carried yet). `sent` is the
    connection's set of ids already carried; the new ones are added to it. `all_locals`: each thread keeps every
    local, not only those the login side's analysis reads (a small job: the collect argument "all_locals")."""
    traces = item.get("pyspy")
    raw_loops, raw_source, raw_context = item.get("loops"), item.get("source"), item.get("source_context")
    loops: Dict[str, Any] = raw_loops if isinstance(raw_loops, dict) else {}
    source: Dict[str, Any] = raw_source if isinstance(raw_source, dict) else {}
    context = raw_context if isinstance(raw_context, int) else 3
    compact = {k: v for k, v in item.items() if k not in ("pyspy", "loops", "source")}
    new: Dict[str, Any] = {}
    if not isinstance(traces, list):
        compact["threads"] = None  # py-spy gave nothing: /proc's threads (procfs) are all there is
        return compact, new
    if len(sent) > MAX_SENT:
        sent.clear()
    threads = []
    for t in traces:
        if not isinstance(t, dict):
            continue
        raw_frames = t.get("frames")
        frames: List[Dict[str, Any]] = raw_frames if isinstance(raw_frames, list) else []
        entry = _entry(frames, loops, source, context)
        sid = stack_id(entry)
        if sid not in sent:
            sent.add(sid)
            new[sid] = entry
        threads.append({"thread_id": t.get("thread_id"), "os_thread_id": t.get("os_thread_id"),
                        "thread_name": t.get("thread_name"), "active": t.get("active"),
                        "owns_gil": t.get("owns_gil"), "stack": sid, "locals": _kept(frames, loops, source, all_locals)})
    compact["threads"] = threads
    return compact, new


def full_locals(item: Dict[str, Any]) -> Optional[int]:
    """How many locals the full item carries (for the note a compact rank gets)."""
    traces = item.get("pyspy")
    if not isinstance(traces, list):
        return None
    return sum(len(f.get("locals") or []) for t in traces if isinstance(t, dict)
               for f in t.get("frames") or [] if isinstance(f, dict))
