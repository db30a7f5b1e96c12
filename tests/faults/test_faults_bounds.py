"""Fault matrix, issue 19: every wait has a deadline the user set, every size from a node or a file a limit.

Through the real CLI. The SSH rows use real listeners on loopback (a socket that accepts and never speaks, one
that closes before a banner as sshd does under MaxStartups, a closed port, a name that does not resolve); no
test cluster is needed. Times are asserted against the bound the flags give (README: ceil(N/F) x C for nodes
that fail to connect, plus (samples-1) x interval), with a margin for interpreter start on a loaded machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import resource
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import asyncssh
import pytest

from app.model import NodeStatus, RankSnapshot, Snapshot
from app.model.codec import snapshot_from_json, snapshot_to_json
from app.transport.ssh import SshOptions, SshTransport, _Client
from app.transport.hostkeys import HostKeyCheck

REPO = Path(__file__).resolve().parents[2]
MARGIN = 15.0  # seconds: interpreter start and imports on a loaded 2-core machine, never the deadline itself
MEMORY_LIMIT = 1 << 30  # address space for a run that must not grow with a number it was given


def hangscope(*args: str, stdin: bytes | None = None, timeout: float = 120,
              limit_memory: bool = False) -> tuple[subprocess.CompletedProcess, float]:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))

    started = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "app", *args], input=stdin, capture_output=True, text=stdin is None,
                         cwd=REPO, timeout=timeout, env=dict(os.environ, PYTHONPATH=str(REPO)),
                         preexec_fn=limit if limit_memory else None)
    return res, time.monotonic() - started


class Listener:
    """A real TCP listener on loopback. `silent`: accepts and never writes (an sshd that hangs before its
    banner); otherwise it closes each connection at once, before any banner (sshd dropping it: MaxStartups)."""

    def __init__(self, silent: bool) -> None:
        self.silent = silent
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.accepted: list[float] = []
        self.held: list[socket.socket] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted.append(time.monotonic())
            if self.silent:
                self.held.append(conn)
            else:
                conn.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accept() the serving thread sits in
        self.sock.close()
        self.thread.join(10)
        for c in self.held:
            c.close()


@pytest.fixture
def listeners():
    made: list[Listener] = []

    def make(silent: bool) -> Listener:
        made.append(Listener(silent))
        return made[-1]

    yield make
    for lst in made:
        lst.close()


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_silent_and_dropping_sshds_cost_one_connect_deadline_each_and_are_not_retried(tmp_path, listeners) -> None:
    """A hosts file mixing 4 sshds that accept TCP and never speak, one that drops before its banner, a closed
    port and a name that does not resolve: the whole run (2 samples) stays within ceil(N/F) x C + interval;
    each silent listener saw exactly one connection (no MaxStartups retries, no reconnect in sample 2)."""
    # hangscope's own default deadline (a shorter one is lost to a busy machine before the first drop is seen)
    connect_timeout, fanout, interval = SshOptions().connect_timeout, 2, 1.0
    silent = [listeners(True) for _ in range(4)]
    dropper = listeners(False)
    lines = [f"[127.0.0.1]:{s.port}" for s in silent] + [f"[127.0.0.1]:{dropper.port}",
                                                         f"[127.0.0.1]:{_closed_port()}", "no-such-node.invalid"]
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("\n".join(lines) + "\n")
    config = tmp_path / "ssh_config"
    config.write_text("")  # no ~/.ssh/config: nothing of this machine's setup applies
    out = tmp_path / "out.json"
    res, elapsed = hangscope(str(hosts), "-F", str(config), "--snapshot", str(out), "-q",
                             "--connect-timeout", str(connect_timeout), "--fanout", str(fanout),
                             "--samples", "2", "--interval", str(interval))
    bound = math.ceil(len(lines) / fanout) * connect_timeout + interval
    print(f"\n{len(lines)} failing nodes, C={connect_timeout:g} s, F={fanout}: {elapsed:.1f} s "
          f"(bound {bound:g} s + {MARGIN:g} s margin)")
    assert res.returncode == 3, res.stderr
    assert "nothing was collected: every node failed (7 of 7)" in res.stderr
    assert elapsed <= bound + MARGIN, f"{elapsed:.1f} s is more than the flags allow ({bound:g} s + margin)"
    snap, _ = snapshot_from_json(out.read_text())
    errors = {n.name: n.error for n in snap.nodes}
    for s in silent:
        err = errors[f"127.0.0.1:{s.port}"]
        assert err.code == "connect_timeout" and err.phase == "login", err
        assert f"accepted the TCP connection but sshd sent no SSH banner within the {connect_timeout:g} s connect deadline " \
               "(--connect-timeout)" in err.message
        assert len(s.accepted) == 1, f"{len(s.accepted)} connections: retried or reconnected"
    err = errors[f"127.0.0.1:{dropper.port}"]
    assert err.code == "throttled" and "MaxStartups" in err.message and f"{connect_timeout:g} s connect deadline" in err.message
    assert 2 <= len(dropper.accepted) <= 5, "backed off and retried, within the one deadline"
    assert dropper.accepted[-1] - dropper.accepted[0] <= connect_timeout + 1.0, "no retry after the deadline"
    assert errors[lines[5].replace("[127.0.0.1]", "127.0.0.1")].code == "refused" and errors["no-such-node.invalid"].code == "dns"


async def test_asyncssh_login_timer_is_a_deadline_not_maxstartups(listeners) -> None:
    """asyncssh's own login timer ends a connection to a silent sshd as a loss before the banner; that is
    the node's deadline (connect_timeout), never MaxStartups (which would be retried)."""
    lst = listeners(True)
    t = SshTransport(SshOptions(config_paths=(), connect_timeout=3.0))
    client = _Client(HostKeyCheck(asyncssh.SSHKnownHosts(), False))
    with pytest.raises(asyncssh.ConnectionLost) as raised:
        await asyncssh.connect("127.0.0.1", lst.port, config=(), known_hosts=None, login_timeout=0.5,
                               client_factory=lambda: client)
    assert raised.value.reason == "Login timeout expired"
    err = t._translate(raised.value, "n1", "127.0.0.1", lst.port, "login", client, None)
    assert err.code == "connect_timeout", err
    assert "n1: 127.0.0.1:" in err.message and "sent no SSH banner within the 3 s connect deadline" in err.message


async def test_a_failed_node_is_reconnected_only_when_asked(tmp_path, listeners) -> None:
    """Headless samples (refresh(reconnect=False)) leave a node that failed to connect alone; the TUI's refresh
    (the default, which the user asks for) tries it again, within the same deadline."""
    from app.hosts import parse_hosts
    from app.session import Session, SessionOptions

    lst = listeners(True)
    config = tmp_path / "ssh_config"
    config.write_text("")
    connect_timeout = 1.5
    hosts = parse_hosts(f"[127.0.0.1]:{lst.port}\n", "t").hosts
    session = Session(hosts, SessionOptions(connect_timeout=connect_timeout, ssh_config=(str(config),)))
    try:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        snap = await session.snapshot()
        first = loop.time() - t0
        (node,) = snap.nodes
        assert node.state == "failed" and node.error.code == "connect_timeout" and "no SSH banner" in node.error.message
        assert first <= connect_timeout + 5.0 and len(lst.accepted) == 1
        t0 = loop.time()
        again = await session.refresh(reconnect=False)
        assert loop.time() - t0 < connect_timeout, "no second connect deadline spent"
        assert len(lst.accepted) == 1 and again.nodes[0].error.message == node.error.message
        await session.refresh()
        assert len(lst.accepted) == 2, "an asked-for refresh tries the node again"
    finally:
        await session.close()


# -- sizes from a node or a file -------------------------------------------------------------------------------

def _snapshot_file(path: Path, world) -> None:
    ranks = tuple(RankSnapshot(node="n1", pid=100 + i, start_time=1, rank=i, world_size=world, collected=True)
                  for i in range(2))
    path.write_text(snapshot_to_json(Snapshot(taken_at=1.0, nodes=(NodeStatus("n1", state="done"),),
                                              ranks=ranks)))


def test_a_snapshot_an_editor_saved_with_a_byte_order_mark_loads(tmp_path) -> None:
    f = tmp_path / "snap.json"
    _snapshot_file(f, 2)
    f.write_bytes(b"\xef\xbb\xbf" + f.read_bytes())
    res, _ = hangscope("--load", str(f), "--print", timeout=60)
    assert res.returncode in (0, 1), res.stderr
    assert "bad input" not in res.stderr and "Traceback" not in res.stderr


def test_load_with_world_size_1e12_is_bounded_with_a_clear_finding(tmp_path) -> None:
    f = tmp_path / "snap.json"
    _snapshot_file(f, 10 ** 12)
    doc = json.loads(f.read_text())
    for r in doc["snapshot"]["ranks"]:
        r["world_size"] = 1e12  # as JSON writes it: a number JSON Schema's "integer" accepts
    f.write_text(json.dumps(doc))
    res, elapsed = hangscope("--load", str(f), "--print", limit_memory=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "WORLD_SIZE=1000000000000 is not a plausible number of ranks" in res.stdout
    assert "Traceback" not in res.stderr
    assert elapsed <= MARGIN, "a load of two ranks is interpreter start only"
    # a plausible WORLD_SIZE still counts the missing ranks, as ranges
    _snapshot_file(f, 1_000_000)
    res, _ = hangscope("--load", str(f), "--print", limit_memory=True, timeout=60)
    assert res.returncode == 0 and "ranks 2-999999 not found (WORLD_SIZE=1000000)" in res.stdout, res.stderr


def test_live_rank_with_world_size_1e9_is_bounded_with_a_clear_finding(tmp_path) -> None:
    """A real process on this machine whose environment says WORLD_SIZE=1000000000, collected by the real CLI
    (local mode) under a 1 GiB address-space limit: a finding saying so, partial (1), within --timeout."""
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                            env=dict(os.environ, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1000000000",
                                     MASTER_ADDR="127.0.0.1", MASTER_PORT="29999"))
    try:
        time.sleep(0.5)
        dump_timeout = 20.0
        res, elapsed = hangscope("--pid", str(rank.pid), "--print", "--samples", "1", "--no-locals",
                                 "--timeout", str(dump_timeout), limit_memory=True, timeout=120)
    finally:
        rank.kill()
        rank.wait()
    assert "Traceback" not in res.stderr and "MemoryError" not in res.stderr, res.stderr
    assert "WORLD_SIZE=1000000000 is not a plausible number of ranks" in res.stdout, res.stdout
    assert res.returncode == 1, res.stderr  # ranks of that job cannot be counted: not "every rank collected"
    assert "partial: WORLD_SIZE=1000000000 is not a plausible number of ranks" in res.stderr
    assert elapsed <= dump_timeout + MARGIN


# -- hosts input ------------------------------------------------------------------------------------------------

def test_dev_zero_as_hosts_file_is_refused_with_a_message(tmp_path: Path) -> None:
    # a device is refused before a byte is read; a regular file of zeros larger than any hosts input, at its bound
    res, elapsed = hangscope("/dev/zero", "--print", limit_memory=True, timeout=60)
    assert res.returncode == 2, res.stderr
    assert "bad hosts input: /dev/zero: is a character device, not a regular file" in res.stderr
    assert "Traceback" not in res.stderr and elapsed <= MARGIN
    zeros = tmp_path / "hosts.txt"
    with open(zeros, "wb") as f:
        f.truncate(64 << 20)  # sparse: reads as 64 MiB of NUL bytes
    res, elapsed = hangscope(str(zeros), "--print", limit_memory=True, timeout=60)
    assert res.returncode == 2, res.stderr
    assert f"bad hosts input: {zeros}: more than 32 MiB: larger than any hosts input" in res.stderr
    assert "Traceback" not in res.stderr and elapsed <= MARGIN


def test_endless_stdin_is_refused_with_a_message() -> None:
    yes = subprocess.Popen(["yes", "node1"], stdout=subprocess.PIPE)
    try:
        started = time.monotonic()
        res = subprocess.run([sys.executable, "-m", "app", "-", "--print"], stdin=yes.stdout, capture_output=True,
                             text=True, cwd=REPO, timeout=60, env=dict(os.environ, PYTHONPATH=str(REPO)),
                             preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT,) * 2))
        elapsed = time.monotonic() - started
    finally:
        yes.kill()
        yes.wait()
    assert res.returncode == 2, res.stderr
    assert "bad hosts input: <stdin>: more than 1000000 lines: larger than any hosts input" in res.stderr
    assert "Traceback" not in res.stderr and elapsed <= MARGIN


@pytest.mark.parametrize("line, expect", [
    ("node01 slots=5000", "slots must be an integer from 1 to 4096, not '5000'"),
    ("node01:999999999", "slots must be an integer from 1 to 4096, not '999999999' (host:N means N slots"),
])
def test_slots_beyond_any_node_are_refused(tmp_path, line, expect) -> None:
    hosts = tmp_path / "hosts.txt"
    hosts.write_text(line + "\n")
    res, elapsed = hangscope(str(hosts), "--print", timeout=60)
    assert res.returncode == 2 and expect in res.stderr, res.stderr
    assert elapsed <= MARGIN


def test_slots_of_a_loaded_node_draw_a_bounded_number_of_cells() -> None:
    """A snapshot file may say anything: slots=10^12 on a failed node must not become 10^12 grid cells."""
    from app.ui.grid_model import MAX_EXPECTED_CELLS, build_grid

    snap = Snapshot(taken_at=1.0, nodes=(NodeStatus("n1", state="failed", slots=10 ** 12),
                                         NodeStatus("n2", state="done", slots=10 ** 12)))
    grid = build_grid(snap, {}, set())  # unbounded, this would be a MemoryError (or never return)
    assert [len(row.cells) for row in grid.rows] == [MAX_EXPECTED_CELLS] * 2
    assert [row.cells[0].kind for row in grid.rows] == ["failed", "missing"]


# -- snapshot files ---------------------------------------------------------------------------------------------

def test_dev_zero_as_snapshot_is_refused_at_its_first_bytes(tmp_path: Path) -> None:
    res, elapsed = hangscope("--load", "/dev/zero", "--print", limit_memory=True, timeout=60)
    assert res.returncode == 2, res.stderr
    assert "bad input: --load /dev/zero: is a character device, not a regular file" in res.stderr
    assert "Traceback" not in res.stderr and elapsed <= MARGIN
    zeros = tmp_path / "snap.json"
    with open(zeros, "wb") as f:
        f.truncate(64 << 20)
    res, elapsed = hangscope("--load", str(zeros), "--print", limit_memory=True, timeout=60)
    assert res.returncode == 2, res.stderr
    assert f"bad input: {zeros} is not a hangscope snapshot (not JSON" in res.stderr
    assert "Traceback" not in res.stderr and elapsed <= MARGIN


def test_a_snapshot_file_larger_than_the_bound_is_refused_before_a_byte_is_read(tmp_path: Path) -> None:
    """A sparse 8 GiB file (or any file past the bound) is refused by its size, under the memory limit: reading it
    to the bound first took ~2 GB."""
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(8 << 30)
    res, elapsed = hangscope("--load", str(big), "--print", limit_memory=True, timeout=60)
    assert res.returncode == 2, res.stderr
    assert f"bad input: {big} is larger than 1024 MiB: not a hangscope snapshot" in res.stderr
    assert "Traceback" not in res.stderr and elapsed <= MARGIN


@pytest.mark.parametrize("text, expect", [
    ("[" * 100_000 + "]" * 100_000, " is not a hangscope snapshot (not JSON: it does not start with an object)"),
    ('{"schema": "hangscope.snapshot", "snapshot": ' + '{"a": ' * 100_000 + "1" + "}" * 100_001,
     ": not a hangscope snapshot: JSON nested more than"),
    ('{"snapshot": ' + "[" * 100_000 + "]" * 100_000 + "}", ": not a hangscope snapshot: JSON nested more than"),
], ids=["brackets", "objects", "brackets-inside"])
def test_deeply_nested_json_is_bad_input_not_a_traceback(tmp_path, text, expect) -> None:
    f = tmp_path / "deep.json"
    f.write_text(text)
    res, elapsed = hangscope("--load", str(f), "--print", timeout=60)
    assert res.returncode == 2, res.stderr
    assert f"bad input: {f}{expect}" in res.stderr
    assert "Traceback" not in res.stderr and elapsed <= MARGIN


@pytest.mark.parametrize("field, value, expect", [
    ("pid", "abc", 'snapshot.ranks[1].pid: expected an integer, got "abc"'),
    ("world_size", [4], "snapshot.ranks[1].world_size: expected an integer, got an array"),
    ("collected", 1, "snapshot.ranks[1].collected: expected true or false, got 1"),
    ("threads", {}, "snapshot.ranks[1].threads: expected an array, got an object"),
    # a process id names a process only when positive; a count is never negative
    ("pid", -5, "snapshot.ranks[1].pid: -5 is out of range (at least 1)"),
    ("pid", 0, "snapshot.ranks[1].pid: 0 is out of range (at least 1)"),
    ("num_threads", -1, "snapshot.ranks[1].num_threads: -1 is out of range (at least 0)"),
])
def test_a_field_of_the_wrong_type_is_refused_naming_where(tmp_path, field, value, expect) -> None:
    f = tmp_path / "snap.json"
    _snapshot_file(f, 2)
    doc = json.loads(f.read_text())
    doc["snapshot"]["ranks"][1][field] = value
    f.write_text(json.dumps(doc))
    res, _ = hangscope("--load", str(f), "--print", timeout=60)
    assert res.returncode == 2, res.stderr
    assert f"does not match the snapshot schema at {expect}" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr


def test_a_missing_required_field_is_refused(tmp_path) -> None:
    f = tmp_path / "snap.json"
    _snapshot_file(f, 2)
    doc = json.loads(f.read_text())
    del doc["snapshot"]["ranks"][0]["pid"]
    f.write_text(json.dumps(doc))
    res, _ = hangscope("--load", str(f), "--print", timeout=60)
    assert res.returncode == 2
    assert "does not match the snapshot schema at snapshot.ranks[0].pid: a required field is missing" in res.stderr


def test_the_loader_accepts_what_the_published_schema_accepts_and_refuses_what_it_refuses(tmp_path) -> None:
    """Our checks and docs/snapshot.schema.json (generated from the same model) agree on the rows above."""
    import jsonschema

    schema = json.loads((REPO / "docs" / "snapshot.schema.json").read_text())
    f = tmp_path / "snap.json"
    _snapshot_file(f, 2)
    good = json.loads(f.read_text())
    jsonschema.validate(good, schema)
    snapshot_from_json(json.dumps(good))
    for field, value in [("pid", "abc"), ("world_size", [4]), ("collected", 1), ("threads", {}), ("pid", 0),
                         ("num_threads", -1)]:
        bad = json.loads(f.read_text())
        bad["snapshot"]["ranks"][1][field] = value
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
        with pytest.raises(ValueError):
            snapshot_from_json(json.dumps(bad))
