"""The worker's request loop over the real protocol: hello, ping, errors, shutdown, EOF, stdlib-only start."""

from __future__ import annotations

import base64
import hashlib
import os
import sys

import pytest

import testenv
from worker_client import WorkerProc
from workers.protocol import ERROR_HINTS, PROTOCOL_VERSION

PY39 = testenv.other_python("3.9")
HELLO_FIELDS = {"type", "protocol", "worker_version", "python", "python_exe", "pid", "uid", "euid", "user",
                "hostname", "kernel", "machine", "ptrace_scope", "cpus", "psutil", "pid_ns", "tools",
                "searched"}


def test_hello_comes_first_with_every_field() -> None:
    with WorkerProc() as w:
        h = w.hello
        assert h["type"] == "hello" and h["protocol"] == PROTOCOL_VERSION
        assert HELLO_FIELDS <= set(h)
        assert h["pid"] == w.proc.pid and h["uid"] == os.getuid()
        assert h["cpus"] >= 1 and h["psutil"] is True  # importable here (found without importing it)
        assert set(h["tools"]) == {"py-spy", "strace", "gdb", "nsenter", "nvidia-smi", "sudo"}
        assert h["tools"]["strace"]["path"].endswith("/strace")
        # only py-spy, which every snapshot runs, is asked for its version at start (the hello is on the
        # critical path of every node); the others are listed by path
        assert h["tools"]["py-spy"]["version"].startswith("py-spy ")
        assert h["tools"]["strace"]["version"] == ""
        for name, paths in h["searched"].items():  # only missing tools list where they were looked for
            assert h["tools"][name] is None and all(p.endswith("/" + name) for p in paths)
        assert w.close() == 0


def test_ping_unknown_op_and_cancel_of_nothing_keep_the_worker_running() -> None:
    with WorkerProc() as w:
        items, done = w.call("ping")
        assert items == [] and done["type"] == "done" and done["data"]["pong"] is True
        _, err = w.call("frobnicate")
        assert err["type"] == "error" and err["code"] == "unknown_op" and "frobnicate" in err["message"]
        assert err["hint"] == ERROR_HINTS["unknown_op"]
        _, done = w.call("cancel", {"target": 999})
        assert done["data"] == {"cancelled": False}
        _, done = w.call("ping")
        assert done["type"] == "done"
        assert w.close() == 0


def test_retire_ends_the_worker_of_a_lost_connection_and_nothing_else() -> None:
    """A cut link never delivers EOF to the worker at its end: the session's next worker on the node ends it by
    its pid. Only a process of the same user running the very same command line is ended."""
    import subprocess
    import time

    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with WorkerProc() as lost, WorkerProc() as new:
            _, done = new.call("retire", {"pid": other.pid})  # not a worker: left alone
            assert done["data"] == {"retired": False, "why": "not a worker of this session"}
            assert other.poll() is None
            _, done = new.call("retire", {"pid": new.proc.pid})
            assert done["data"]["retired"] is False
            _, done = new.call("retire", {"pid": lost.proc.pid})
            assert done["data"] == {"retired": True, "why": "ended with SIGTERM"}
            deadline = time.monotonic() + 5
            while lost.proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            assert lost.proc.poll() is not None, "the lost connection's worker still runs"
            _, done = new.call("ping")  # the new one goes on
            assert done["type"] == "done"
    finally:
        other.kill()
        other.wait()

@pytest.mark.parametrize("line", [b"not json\n", b"[1, 2]\n", b'{"op": "ping"}\n', b'{"id": 1}\n',
                                  b'{"id": true, "op": "ping"}\n', b'{"id": 1, "op": "ping", "args": 3}\n'])
def test_malformed_line_is_answered_then_the_worker_exits(line: bytes) -> None:
    with WorkerProc() as w:
        w.send_raw(line)
        err = w.read()
        assert err["type"] == "error" and err["id"] is None and err["code"] == "bad_request"
        assert w.proc.wait(timeout=10) == 2


def test_bad_argument_fails_only_that_request() -> None:
    with WorkerProc() as w:
        _, err = w.call("cancel", {"target": "x"})
        assert err["code"] == "bad_request" and err["id"] is not None
        _, done = w.call("ping")
        assert done["type"] == "done"


def test_shutdown_answers_then_exits() -> None:
    with WorkerProc() as w:
        _, done = w.call("shutdown")
        assert done == {"type": "done", "id": done["id"], "data": {}}
        assert w.proc.wait(timeout=10) == 0
        with pytest.raises(EOFError):
            w.read(timeout=5)


def test_eof_exits_promptly_and_quietly_on_stdout() -> None:
    with WorkerProc() as w:
        assert w.close(timeout=10) == 0
        with pytest.raises(EOFError):
            w.read(timeout=5)


def test_stray_print_goes_to_stderr_not_the_protocol() -> None:
    # The worker rebinds sys.stdout to stderr: a print in some op can never corrupt the JSON stream.
    with WorkerProc() as w:
        assert sys.stdout is not None  # (the test process is unaffected)
        items, done = w.call("ping")
        assert done["type"] == "done"


@pytest.mark.parametrize("python", [sys.executable, PY39])
def test_isolated_stdlib_only_start(python: str) -> None:
    if not os.path.exists(python):
        pytest.skip("no %s here" % python)
    with WorkerProc(python=python, isolated=True) as w:
        assert w.hello["psutil"] is False  # -I -S: no site-packages, so no psutil
        assert w.hello["python"].startswith(".".join(python.rsplit("python", 1)[1].split(".")[:2])
                                            if python == PY39 else "3.")
        _, done = w.call("ping")
        assert done["type"] == "done"
        assert w.close() == 0


def test_push_tool_checks_sha256_and_keeps_an_executable() -> None:
    script = b"#!/bin/sh\necho pushed-ok\n"
    good = hashlib.sha256(script).hexdigest()
    with WorkerProc() as w:
        _, err = w.call("push_tool", {"name": "py-spy", "data_b64": base64.b64encode(script).decode(),
                                      "sha256": "0" * 64})
        assert err["code"] == "bad_request" and "sha256" in err["message"]
        _, done = w.call("push_tool", {"name": "py-spy", "data_b64": base64.b64encode(script).decode(),
                                       "sha256": good})
        path = done["data"]["path"]
        assert done["data"]["name"] == "py-spy" and os.access(path, os.X_OK)
        with open(path, "rb") as f:
            assert f.read() == script
        assert w.close() == 0
        assert not os.path.exists(path)  # memfd or temp dir: gone with the worker


def test_requests_already_buffered_by_the_bootstrap_are_not_lost() -> None:
    # The bootstrap reads its payload from sys.stdin.buffer; the buffer then holds the first requests too.
    import json
    import subprocess

    from worker_client import REPO

    boot = ("import sys; assert sys.stdin.buffer.read(7) == b'PAYLOAD'; sys.path.insert(0, %r); "
            "from workers.__main__ import main; sys.exit(main())" % REPO)
    proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", boot], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(b'PAYLOAD{"id":1,"op":"ping"}\n{"id":2,"op":"shutdown"}\n', timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    msgs = [json.loads(line) for line in out.splitlines()]
    assert [(m["type"], m.get("id")) for m in msgs] == [("hello", None), ("done", 1), ("done", 2)]
    assert proc.returncode == 0, err
