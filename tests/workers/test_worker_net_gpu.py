"""A rank's TCP connections (for network stalls) and GPUs (nvidia-smi) as discovery reports them."""

from __future__ import annotations

import os
import shutil
import socket
import stat

from worker_client import WorkerProc
from worker_targets import start_rank
from workers.collect import gpus, sockets


def test_rank_sockets_show_peer_state_and_unread_bytes() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        with start_rank(0, ["--connect", "127.0.0.1:%d" % port]) as t:
            conn, peer = listener.accept()
            with conn:
                conn.sendall(b"x" * 1000)  # the rank never reads: it stays in its receive queue
                with WorkerProc() as w:
                    items, _ = w.call("discover")
                    rank = {i["pid"]: i for i in items}[t.pid]
                    (s,) = rank["sockets"]
                    assert s["local"] == "%s:%d" % peer and s["peer"] == "127.0.0.1:%d" % port
                    assert s["state"] == "ESTABLISHED" and s["recv_q"] == 1000 and s["send_q"] == 0
                    assert s["retransmits"] == 0 and s["backoff"] == 0
                    if shutil.which("ss"):  # ss -ti adds the timers
                        assert s["last_recv_ms"] is not None and s["last_send_ms"] is not None


def test_proc_net_tcp6_and_ss_addresses_agree() -> None:
    with socket.socket(socket.AF_INET6) as v6:
        v6.bind(("::1", 0))
        v6.listen(1)
        port = v6.getsockname()[1]
        inode = os.fstat(v6.fileno()).st_ino
        with open("/proc/self/net/tcp6") as f:
            rows = sockets.parse_proc_tcp(f.read())
        assert rows[inode]["local"] == "[::1]:%d" % port and rows[inode]["state"] == "LISTEN"
    assert sockets.normalise("[::ffff:10.0.0.1]:29500") == "10.0.0.1:29500"
    assert sockets.normalise("[fe80::1%eth0]:22") == "[fe80::1]:22"
    ss = ("ESTAB 0 4096 10.0.0.2:41234 10.0.0.1:29500\n"
          "\t cubic wscale:7,7 rto:3264 backoff:4 rtt:0.05/0.02 retrans:1/9 lastsnd:15230 lastrcv:15260 "
          "lastack:15260 unacked:3\n")
    assert sockets.parse_ss(ss) == {("10.0.0.2:41234", "10.0.0.1:29500"): {
        "backoff": 4, "retrans": 9, "lastsnd": 15230, "lastrcv": 15260, "lastack": 15260}}


# nvidia-smi output in the documented CSV form. There is no GPU here, so discovery's use of it is checked
# with a FAKE nvidia-smi that prints such lines for the test's rank (a GPU cannot be produced for real).
APPS = "{pid}, GPU-1f2e3d4c-0000-1111-2222-333344445555, 8123\n"
GPUS = ("0, GPU-1f2e3d4c-0000-1111-2222-333344445555, NVIDIA H100 80GB HBM3\n"
        "1, GPU-99999999-0000-1111-2222-333344445555, NVIDIA H100 80GB HBM3\n")


def fake_nvidia_smi(tmp_path, body: str) -> str:
    bindir = os.path.join(str(tmp_path), "bin")
    os.makedirs(bindir, exist_ok=True)
    path = os.path.join(bindir, "nvidia-smi")
    with open(path, "w") as f:
        f.write("#!/bin/sh\n# FAKE nvidia-smi for the GPU discovery test\n" + body)
    os.chmod(path, stat.S_IRWXU)
    return bindir


def test_gpus_of_a_rank_from_nvidia_smi(tmp_path) -> None:
    with start_rank(0) as t:
        body = ('case "$1" in --query-compute-apps*) printf "%s";; --query-gpu*) printf "%s";; esac\n'
                % (APPS.format(pid=t.pid).replace("\n", "\\n"), GPUS.replace("\n", "\\n")))
        bindir = fake_nvidia_smi(tmp_path, body)
        with WorkerProc(env={"PATH": bindir + ":" + os.environ["PATH"]}) as w:
            # the test's own rank: other processes on this machine (a session's shared spawn job, other users'
            # jobs) bring discovery notes of their own
            items, done = w.call("discover", {"pids": [t.pid]})
            rank = {i["pid"]: i for i in items}[t.pid]
            assert rank["gpus"] == [{"index": 0, "uuid": "GPU-1f2e3d4c-0000-1111-2222-333344445555",
                                     "name": "NVIDIA H100 80GB HBM3", "used_mib": 8123}]
            assert done["data"]["notes"] == []


def test_nvidia_smi_runs_again_only_when_the_ranks_change(tmp_path) -> None:
    # nvidia-smi initialises the driver at every run (~0.1-0.5 s of CPU): a refresh of the same ranks reuses
    # the answer; a new rank asks again. The FAKE nvidia-smi counts its runs in a file.
    runs = tmp_path / "runs"
    with start_rank(0) as t:
        body = ('echo x >> %s\ncase "$1" in --query-compute-apps*) printf "%s";; --query-gpu*) printf "%s";; '
                'esac\n' % (runs, APPS.format(pid=t.pid).replace("\n", "\\n"), GPUS.replace("\n", "\\n")))
        bindir = fake_nvidia_smi(tmp_path, body)
        with WorkerProc(env={"PATH": bindir + ":" + os.environ["PATH"]}) as w:
            # the test's own ranks (other work on the machine starts and ends ranks, and with them the GPU query)
            for _ in range(3):
                items, _ = w.call("discover", {"pids": [t.pid]})
                assert {i["pid"]: i for i in items}[t.pid]["gpus"][0]["used_mib"] == 8123
            assert runs.read_text().count("x") == 2, "one query (two nvidia-smi runs) for three refreshes"
            with start_rank(1) as t1:
                items, _ = w.call("discover", {"pids": [t.pid, t1.pid]})
                assert t1.pid in {i["pid"] for i in items}
                assert runs.read_text().count("x") == 4, "a new rank: asked again"


def test_a_failing_nvidia_smi_becomes_a_note_not_a_failure(tmp_path) -> None:
    msg = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
    bindir = fake_nvidia_smi(tmp_path, 'echo "%s"; exit 9\n' % msg)
    with start_rank(0) as t, WorkerProc(env={"PATH": bindir + ":" + os.environ["PATH"]}) as w:
        items, done = w.call("discover")
        assert t.pid in {i["pid"] for i in items}
        assert any(msg in n for n in done["data"]["notes"])


def test_gpu_table_parsing_skips_noise() -> None:
    assert gpus.by_pid("No running processes found\n", GPUS) == {}
    assert gpus.by_pid("42, GPU-x, [N/A]\n", "") == {42: [{"index": None, "uuid": "GPU-x", "name": "",
                                                          "used_mib": None}]}


def _proc_and_ss_rows() -> dict:
    """The slow path's rows for this namespace: /proc/self/net/tcp{,6} joined with `ss -tin`."""
    import subprocess

    ss = sockets.parse_ss(subprocess.run(["ss", "-tinHn"], capture_output=True, text=True).stdout)
    table = sockets.tcp_table(os.getpid())
    out = {}
    for inode in table:
        row = dict(table[inode])
        extra = ss.get((row["local"], row["peer"]))
        if extra:
            row["backoff"] = extra.get("backoff", 0)
            row["total_retrans"] = extra.get("retrans")
            row["last_send_ms"], row["last_recv_ms"] = extra.get("lastsnd"), extra.get("lastrcv")
            row["last_ack_ms"] = extra.get("lastack")
            row["bytes_acked"], row["bytes_received"] = extra.get("bytes_acked"), extra.get("bytes_received")
        out[inode] = row
    return out


def test_netlink_dump_gives_what_proc_net_tcp_and_ss_give() -> None:
    if not shutil.which("ss"):
        import pytest

        pytest.skip("needs ss for the comparison")
    with socket.socket() as l4, socket.socket(socket.AF_INET6) as l6:
        l4.bind(("127.0.0.1", 0))
        l4.listen(4)
        l6.bind(("::", 0))  # dual stack: an IPv4 client shows as v4-mapped on the accepted side
        l6.listen(4)
        with socket.create_connection(l4.getsockname()) as c4, \
                socket.create_connection(("127.0.0.1", l6.getsockname()[1])) as c6:
            s4, _ = l4.accept()
            s6, _ = l6.accept()
            with s4, s6:
                s4.sendall(b"x" * 3000)  # unread by c4: its receive queue
                c6.sendall(b"y" * 10)
                ino = {name: os.fstat(s.fileno()).st_ino
                       for name, s in (("l4", l4), ("l6", l6), ("c4", c4), ("c6", c6), ("s4", s4), ("s6", s6))}
                fast = sockets.netlink_table()
                slow = _proc_and_ss_rows()
    assert fast is not None, "netlink sock_diag refused here"
    mine = set(ino.values())
    assert mine <= set(fast) and mine <= set(slow)
    for inode in mine:
        a, b = fast[inode], slow[inode]
        for key in ("last_send_ms", "last_recv_ms", "last_ack_ms"):
            # read milliseconds apart; ss leaves a zero out (None), so a fresh socket may be None on one side
            assert abs((a[key] or 0) - (b[key] or 0)) < 2000, (key, a, b)
        # ss leaves a zero counter out too (None); netlink gives 0
        for key in ("bytes_acked", "bytes_received"):
            assert (a[key] or 0) == (b[key] or 0), (key, a, b)
        assert {k: v for k, v in a.items() if not k.startswith(("last_", "bytes_"))} == \
            {k: v for k, v in b.items() if not k.startswith(("last_", "bytes_"))}
    assert fast[ino["c4"]]["recv_q"] == 3000 and fast[ino["c4"]]["state"] == "ESTABLISHED"
    assert fast[ino["l6"]]["state"] == "LISTEN" and fast[ino["l6"]]["local"].startswith("[::]:")
    assert fast[ino["s6"]]["peer"].startswith("127.0.0.1:"), "v4-mapped peers are written as IPv4"
