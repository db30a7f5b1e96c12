"""strace and gdb on one target: the same checks as py-spy (right process, no other tracer, one ptrace tool
at a time), a deadline, and a target that is never left stopped or traced."""

from __future__ import annotations

import os
import signal
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: see workers/__init__.py
    from typing import Any, Dict, List

from workers.collect import guard, runas
from workers.collect.guard import CollectError
from workers.redact import redact_text
from workers.tooltext import gdb_text, strace_text
from workers.request import Cancelled, OpError, Request

MAX_STRACE_BYTES = 8 << 20
TAIL_BYTES = 1 << 20


def _run_traced(req: Request, tool_name: str, args: List[str], pid: int, start_time: Any, timeout: float,
                stop_after: Any = None, max_stderr: int = MAX_STRACE_BYTES) -> Dict[str, Any]:
    try:
        before = guard.check_before(pid, start_time)
        guard.refuse_held(pid, tool_name)  # state first: nothing attaches to a stopped, frozen or D process
        prefix = runas.prefix(req, req.sudo)
        tool, searched = req.worker.tools.find(tool_name, pid)
        if tool is None:
            raise CollectError("tool_missing", "%s not found on this node; searched: %s"
                               % (tool_name, ", ".join(searched)))
        with guard.Exclusive(pid, "%s, request %d" % (tool_name, req.id)):
            path, fds = tool.exec_path(inside_ns=False)
            res = None
            try:
                res = req.run(prefix + [path] + args, timeout, pass_fds=fds, stop_after=stop_after,
                              stop_signal=signal.SIGINT, max_stdout=MAX_STRACE_BYTES, max_stderr=max_stderr,
                              keep_tail=TAIL_BYTES)
            except OSError as exc:
                raise CollectError("tool_failed", "cannot run %s (%s): %s" % (tool_name, path, exc))
            finally:
                killed = res is not None and (res.timed_out or res.killed)
                after, resumed = guard.check_after(pid, before, killed)
    except CollectError as exc:
        raise OpError(exc.code, exc.message)
    if res.killed:
        raise Cancelled()
    stderr = res.stderr.decode("utf-8", "replace")
    sudo_err = runas.sudo_error(stderr) if req.sudo else None
    if sudo_err:
        raise OpError("sudo_password", sudo_err)
    if res.timed_out:
        raise OpError("timeout", "%s did not finish within %.1fs and was killed; target state after: %s%s"
                      % (tool_name, timeout, after or "gone", " (resumed)" if resumed else ""))
    return {"res": res, "stderr": stderr, "state_after": after, "resumed": resumed}


def strace(req: Request) -> Dict[str, Any]:
    pid = req.arg_int("pid", required=True)
    assert pid is not None
    start_time = req.arg_int("start_time")
    seconds = min(req.arg_float("seconds", 2.0), 600.0)
    max_lines = req.arg_int("max_lines", 2000) or 2000
    # The bytes a call read or wrote are not needed to diagnose a hang (syscall, fd, size and result are) and
    # may be anything the job sends (HTTP headers, credentials, protocol logins): dropped (`""...`), and with
    # --strace-data only the protocol verb they start with is kept (`"AUTH"...`: workers/tooltext.py), never
    # the rest. strace reads the first 64 bytes for that, and they never leave this function.
    data = req.args.get("data") is True
    started = time.monotonic()
    # strace writes its trace to stderr; SIGINT at `seconds` makes it detach cleanly, the kill at the
    # deadline is for a strace that does not.
    out = _run_traced(req, "strace", ["-f", "-p", str(pid), "-tt", "-T", "-qq", "-s", "64" if data else "0"],
                      pid, start_time, timeout=seconds + 10.0, stop_after=seconds)
    res = out["res"]
    lines = out["stderr"].splitlines()
    if res.returncode not in (0, None) and not res.stopped and _attach_failed(lines):
        code = "target_exited" if not os.path.exists("/proc/%d" % pid) else "ptrace_denied"
        detail = next(ln for ln in lines if "attach" in ln).split("strace: ", 1)[-1]
        raise OpError(code, "strace could not attach to pid %d (worker uid %d): %s" % (pid, os.getuid(), detail))
    output, truncated = cap_lines(lines, res.stderr_tail.decode("utf-8", "replace"), max_lines)
    return {"pid": pid, "output": redact_text(strace_text(output, verbs=data)), "truncated": truncated,
            "lines": res.stderr_lines, "resumed": out["resumed"], "elapsed": round(time.monotonic() - started, 3), "seconds": seconds,
            "payloads": data}


def cap_lines(head: List[str], tail_text: str, max_lines: int) -> "tuple[str, bool]":
    """At most max_lines lines: the first half and the last half around one `[truncated: ...]` marker. The
    end matters most: what each thread was still blocked in when strace detached."""
    if not tail_text and len(head) <= max_lines:
        return "\n".join(head), False
    first = max(1, max_lines // 2)
    last = max(1, max_lines - first)
    if tail_text:
        tail = tail_text.splitlines()[1:]  # the first line of the tail is cut mid-way
        marker = "[truncated]"
    else:
        tail = head[first:]
        marker = "[truncated: %d lines]" % (len(head) - first - min(last, len(tail)))
    return "\n".join(head[:first] + [marker] + tail[-last:]), True


def _attach_failed(lines: List[str]) -> bool:
    # strace names itself by its argv[0]: "/usr/bin/strace: attach: ptrace(PTRACE_SEIZE, 42): ..."
    return any("strace: attach:" in ln or "strace: Could not attach" in ln for ln in lines[:5])


def gdb(req: Request) -> Dict[str, Any]:
    pid = req.arg_int("pid", required=True)
    assert pid is not None
    start_time = req.arg_int("start_time")
    timeout = req.arg_float("timeout", 30.0) or 30.0
    started = time.monotonic()
    args = ["-p", str(pid), "-batch", "-nx", "-iex", "set debuginfod enabled off", "-ex", "set pagination off",
            "-ex", "thread apply all bt", "-ex", "detach", "-ex", "quit"]
    out = _run_traced(req, "gdb", args, pid, start_time, timeout=timeout)
    stdout = out["res"].stdout.decode("utf-8", "replace")
    if "ptrace: Operation not permitted" in out["stderr"] and "Thread" not in stdout:
        raise OpError("ptrace_denied", "gdb could not attach to pid %d: ptrace: Operation not permitted" % pid)
    # a char* argument or a buffer's bytes (a recv() buffer, a command sent) is shown as its size only
    return {"pid": pid, "output": redact_text(gdb_text(stdout)), "stderr": redact_text(out["stderr"])[-4000:],
            "resumed": out["resumed"], "elapsed": round(time.monotonic() - started, 3)}
