"""The bootstrap and the worker connection, through the local transport: a real worker from the payload,
and small FAKE workers (named as such) for faults a real worker cannot produce on demand."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import textwrap
import time
from pathlib import Path

import pytest

import testenv
from app.errors import TransportError
from app.transport import bootstrap
from app.transport.base import WorkerConnection, WorkerRequestError
from app.transport.local import spawn_worker, start_local
from workers import protocol
from workers.protocol import PROTOCOL_VERSION

pytestmark = pytest.mark.timeout(60)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone for our purposes only once reaped; asyncio reaps its children
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("python", [None, "python3 -I -S", "/usr/bin/python3"])
async def test_payload_runs_the_worker_under_each_python(python: str | None) -> None:
    if python == "/usr/bin/python3" and not os.path.exists(python):
        pytest.skip("no system python3 at /usr/bin/python3")
    conn = await start_local(python, name="here", timeout=20)
    try:
        hello = conn.hello
        assert hello["protocol"] == PROTOCOL_VERSION
        assert hello["pid"] == conn.pid and _alive(conn.pid)
        assert hello["python"].count(".") == 2 and isinstance(hello["tools"], dict)
        if python == "python3 -I -S":  # isolated and without site-packages: still a working worker
            assert hello["psutil"] is False
        assert (await conn.call(protocol.PING({}), timeout=10))["pong"] is True
        assert conn.timings["start"] > 0
    finally:
        await conn.close()
    assert conn.exit is not None and conn.exit.returncode == 0 and conn.error is None
    assert not _alive(hello["pid"])


async def test_stage_is_shell_safe_and_small() -> None:
    payload = bootstrap.build_payload()
    stage = payload.stage({"sudo": False})
    assert "'" not in stage and len(stage) < 2000
    assert set(payload.modules) >= {"workers", "workers.__main__", "workers.protocol"}
    # --python is split like shell words (so it may carry flags); the remote command quotes every word again
    cmd = bootstrap.remote_command("'/opt/my python/bin/python3' -I", stage)
    assert cmd.startswith("exec '/opt/my python/bin/python3' -I -c 'import binascii")


def _payload_with_marked_code(tmp_path: Path, blob: bytes | None = None) -> bootstrap.Payload:
    """A payload of a tiny `workers` package whose shipped code for workers.mod differs from its source, so
    the output tells which one ran (source: X = "source"; shipped code: X = "code"); blob replaces the
    whole compiled half."""
    import json
    import marshal
    import zlib

    root = tmp_path / "workers"
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "mod.py").write_text('X = "source"\n')
    (root / "__main__.py").write_text("import sys\ndef main(options):\n    from workers import mod\n"
                                      "    sys.stdout.write(mod.X)\n    return 0\n")
    payload = bootstrap.build_payload.__wrapped__(root)
    raw = zlib.decompress(payload.data[:payload.head])  # the module list, then the compiled code
    head, _, code = raw.partition(b"\n")
    assert json.loads(head)["workers.mod"] is False
    assert json.loads(zlib.decompress(payload.data[payload.head:]))["workers.mod"] == 'X = "source"\n'
    shipped = marshal.loads(code)
    shipped["workers.mod"] = compile('X = "code"\n', bootstrap.module_filename("workers.mod", False), "exec")
    first = zlib.compress(head + b"\n" + (marshal.dumps(shipped) if blob is None else blob))
    return bootstrap.Payload(data=first + payload.data[payload.head:], modules=payload.modules, head=len(first),
                             magic=payload.magic)


@pytest.mark.parametrize("python,blob,expect", [
    (sys.executable, None, "code"),  # same interpreter: the shipped code runs, nothing is compiled
    (testenv.other_python("3.9"), None, "source"),  # other bytecode magic: the sources
    (sys.executable, b"\x00garbage", "source"),  # a damaged compiled half: the sources
])
def test_shipped_code_runs_only_where_the_bytecode_matches(tmp_path: Path, python: str, blob: bytes | None,
                                                           expect: str) -> None:
    import subprocess

    if not os.path.exists(python):
        pytest.skip("no %s here" % python)
    payload = _payload_with_marked_code(tmp_path, blob)
    out = subprocess.run([python, "-c", payload.stage({})], input=payload.data, capture_output=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.decode() == expect


async def test_keep_dir_keeps_a_copy_only_when_asked(tmp_path: Path) -> None:
    keep = tmp_path / "kept"
    conn = await start_local(options={"keep_dir": str(keep)}, timeout=20)
    await conn.close()
    assert (keep / "workers" / "__main__.py").read_text() == (bootstrap.WORKERS_DIR / "__main__.py").read_text()
    assert oct((keep / "workers").stat().st_mode & 0o777) == "0o700"


async def test_old_python_is_no_python(tmp_path: Path) -> None:
    # FAKE python 3.6: the real interpreter with sys.version_info pretending otherwise (no old python here)
    fake = tmp_path / "python3.6-fake"
    fake.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        exec {sys.executable} -c 'import sys; sys.version_info = (3, 6, 15, "final", 0); \\
        sys.version = "3.6.15 (fake)"; exec(sys.argv[2])' "$@"
        """))
    fake.chmod(0o755)
    with pytest.raises(TransportError) as err:
        await start_local(str(fake), name="old", timeout=20)
    assert err.value.code == "no_python" and err.value.phase == "start"
    assert "3.6.15" in err.value.message and "old" in err.value.message and str(fake) in err.value.message


async def test_missing_python_is_no_python() -> None:
    with pytest.raises(TransportError) as err:
        await start_local("/nonexistent/python3", name="n1", timeout=5)
    assert err.value.code == "no_python" and "/nonexistent/python3" in err.value.message


# FAKE workers: each speaks just enough of the protocol to produce one fault a real worker cannot be made to
# produce on demand. argv[1] picks the behaviour.
FAKE_WORKER = textwrap.dedent(r"""
    import json, os, sys, time
    mode = sys.argv[1]
    out = sys.stdout.buffer
    def send(raw):
        out.write(raw + b"\n"); out.flush()
    if mode == "noise":
        send(b"Welcome to the cluster! \xff\xfe (printed by a .bashrc)")
    send(json.dumps({"type": "hello", "protocol": 99 if mode == "version" else 1, "pid": os.getpid(),
                     "tools": {}}).encode())
    for line in sys.stdin.buffer:
        req = json.loads(line)
        if req["op"] == "cancel":
            send(json.dumps({"type": "done", "id": req["id"], "data": {"cancelled": True}}).encode())
            continue
        if mode == "malformed":
            send(b"this is not json")
        elif mode == "crash":
            sys.stderr.buffer.write(b"Traceback: boom \xff\n"); sys.stderr.flush()
            os._exit(3)
        elif mode == "exit0":
            sys.exit(0)
        elif mode in ("noise", "utf8"):
            send(b'{"type":"item","id":%d,"data":{"text":"caf\xc3\xa9 \xff\xfe"}}' % req["id"])
            send(b'{"type":"done","id":%d,"data":{}}' % req["id"])
        elif mode == "big":  # one line of many pipe buffers, as a dump with locals of many threads can be
            send(b'{"type":"item","id":%d,"data":{"x":"%s"}}' % (req["id"], b"a" * 20000000))
            send(b'{"type":"done","id":%d,"data":{}}' % req["id"])
        elif mode == "silent":
            pass
""")


async def _fake(mode: str, tmp_path: Path, timeout: float = 10) -> WorkerConnection:
    script = tmp_path / "fake_worker.py"
    script.write_text(FAKE_WORKER)
    return await spawn_worker([sys.executable, str(script), mode], b"", name="fake", timeout=timeout)


async def test_protocol_version_mismatch(tmp_path: Path) -> None:
    with pytest.raises(TransportError) as err:
        await _fake("version", tmp_path)
    assert err.value.code == "protocol" and "99" in err.value.message


async def test_malformed_line_fails_the_request_and_stops_the_worker(tmp_path: Path) -> None:
    conn = await _fake("malformed", tmp_path)
    try:
        with pytest.raises(TransportError) as err:
            await conn.call(protocol.PING({}), timeout=10)
        assert err.value.code == "protocol" and "not json" in err.value.message
        await asyncio.wait_for(_until_exit(conn), 10)
        assert not _alive(conn.pid or 0)
        with pytest.raises(TransportError):
            conn.request(protocol.PING({}))
    finally:
        await conn.close(kill=True)


async def _until_exit(conn: WorkerConnection) -> None:
    while conn.exit is None:
        await asyncio.sleep(0.01)


async def test_worker_crash_mid_request_carries_its_stderr(tmp_path: Path) -> None:
    conn = await _fake("crash", tmp_path)
    try:
        with pytest.raises(TransportError) as err:
            await conn.call(protocol.PING({}), timeout=10)
        assert err.value.code == "worker_crashed"
        assert "exit status 3" in err.value.message and "boom \ufffd" in err.value.message
    finally:
        await conn.close(kill=True)


async def test_real_worker_killed_mid_request_is_worker_crashed() -> None:
    conn = await start_local(timeout=20)
    pid = conn.pid
    assert pid is not None
    try:
        os.kill(pid, signal.SIGSTOP)  # it cannot answer: the request is surely pending when it dies
        req = conn.request(protocol.PING({}), timeout=10)
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(TransportError) as err:
            await req.collect()
        assert err.value.code == "worker_crashed" and "SIGKILL" in err.value.message
    finally:
        await conn.close(kill=True)
    assert not _alive(pid)


async def test_worker_output_eof_with_a_request_pending(tmp_path: Path) -> None:
    conn = await _fake("exit0", tmp_path)
    try:
        with pytest.raises(TransportError) as err:
            await conn.call(protocol.PING({}), timeout=10)
        assert err.value.code == "worker_crashed" and "exit status 0" in err.value.message
    finally:
        await conn.close(kill=True)


async def test_closing_sends_eof_fails_pending_and_refuses_new_requests(tmp_path: Path) -> None:
    conn = await _fake("silent", tmp_path)
    req = conn.request(protocol.PING({}), timeout=30)
    await conn.close()
    with pytest.raises(TransportError) as err:
        await req.collect()
    assert err.value.code == "cancelled"
    assert conn.exit is not None and conn.exit.returncode == 0  # the fake ends on stdin EOF
    with pytest.raises(TransportError):
        conn.request(protocol.PING({}))


async def test_request_deadline_raises_and_cancels(tmp_path: Path) -> None:
    conn = await _fake("silent", tmp_path)
    try:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(TransportError) as err:
            await conn.call(protocol.PING({}), timeout=0.3)
        assert err.value.code == "timeout" and "ping" in err.value.message
        assert 0.3 <= loop.time() - t0 < 5
        assert conn.error is None  # a slow request does not break the connection
    finally:
        await conn.close(kill=True)


@pytest.mark.parametrize("mode", ["utf8", "noise"])
async def test_non_utf8_and_shell_noise_never_raise(mode: str, tmp_path: Path) -> None:
    conn = await _fake(mode, tmp_path)
    try:
        items, _ = await conn.request(protocol.PING({}), timeout=10).collect()
        assert items == [{"text": "caf\u00e9 \ufffd\ufffd"}]
        if mode == "noise":
            assert conn.warnings and "Welcome to the cluster" in conn.warnings[0]
    finally:
        await conn.close(kill=True)


async def test_a_20_mb_line_arrives_whole_and_fast(tmp_path: Path) -> None:
    conn = await _fake("big", tmp_path)
    try:
        c0 = time.process_time()  # this process's CPU, where the reader runs: what the machine's load does not change
        items, _ = await conn.request(protocol.PING({}), timeout=30).collect()
        assert len(items) == 1 and len(items[0]["x"]) == 20000000
        assert time.process_time() - c0 < 5  # linear in the line's size (the quadratic reader took seconds)
    finally:
        await conn.close(kill=True)


async def test_worker_error_reply_is_typed() -> None:
    conn = await start_local(timeout=20)
    try:
        with pytest.raises(WorkerRequestError) as err:
            await conn.call(protocol.Call("no_such_op", {}), timeout=10)
        assert err.value.code == "unknown_op" and err.value.hint
        assert (await conn.call(protocol.PING({}), timeout=10))["pong"] is True  # the connection survives
    finally:
        await conn.close()


async def test_the_shipped_worker_reads_module_globals_with_the_probe_it_carries() -> None:
    """The layout probe is started from its source, which a worker shipped by the bootstrap (no files on the
    node) gets from the payload's importer: a dump with --locals still adds a top-level loop's globals."""
    from worker_targets import Target, wait_blocked
    from workers import procinfo

    prog = str(Path(__file__).resolve().parents[1] / "support" / "globals_target_prog.py")
    with Target([sys.executable, prog, "block"]) as t:
        pid = int(t.ready[0])
        wait_blocked(pid)
        conn = await start_local(sys.executable, name="here", timeout=20)  # py-spy sits beside it
        try:
            items, _ = await conn.request(protocol.DUMP({"targets": [{"pid": pid, "start_time": procinfo.start_time(pid)}],
                                                         "locals": True, "loops": True}), timeout=30).collect()
        finally:
            await conn.close()
    (item,) = items
    assert item["ok"], item
    (main,) = [th for th in item["pyspy"] if th["os_thread_id"] == pid]
    module = next(f for f in main["frames"] if f["name"] == "<module>")
    assert {lc["name"]: lc["repr"] for lc in module["locals"] if lc.get("global")} == \
        {"step": "3", "batch": "<str>", "iter_num": "4"}, (module, item["notes"])
    assert any(a.startswith("ran its python (") for a in item["actions"]), item["actions"]


def _tiny_workers(tmp_path: Path, source: str) -> Path:
    root = tmp_path / "workers"
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "mod.py").write_text(source)
    return root


def test_a_prebuilt_payload_is_the_one_build_payload_returns(tmp_path: Path) -> None:
    import threading

    root = _tiny_workers(tmp_path, 'X = 1\n')
    bootstrap.prebuild_payload(root)
    payload = bootstrap.build_payload(root)  # waits for the thread, or builds it itself
    assert payload is bootstrap.build_payload(root)
    assert payload == bootstrap.build_payload.__wrapped__(root)  # the same bytes as a build of its own
    assert "workers.mod" in payload.modules
    for thread in threading.enumerate():
        if thread.name == "hangscope-payload":
            thread.join(10)  # done building: it only returns
    bootstrap.prebuild_payload(root)  # built: no second thread
    assert not [t for t in threading.enumerate() if t.name == "hangscope-payload"]


def test_a_payload_the_thread_cannot_build_fails_where_it_is_needed(tmp_path: Path) -> None:
    root = _tiny_workers(tmp_path, 'X = (\n')
    bootstrap.prebuild_payload(root)  # the thread's SyntaxError is not printed nor raised here
    with pytest.raises(SyntaxError):
        bootstrap.build_payload(root)
