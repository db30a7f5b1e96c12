"""What a thread blocked in a system call waits on, and who is at the other end, read from /proc on real processes
(tests/support/kwait_target_prog.py: each blocks in one call and says `ready` through its stdout pipe): a pipe, a FIFO,
stdin, a pty, TCP to a local server and to no local host, poll, epoll, unix sockets, wait4, flock and fcntl locks,
and a spinning thread's CPU time. Each is read by workers/collect/kwait.py as the dump does and decoded into the
model (app/decode/kwait.py); a few go through the real worker's dump. Every process is killed in `finally`."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Sequence, Tuple

import pytest

from app.decode import replies as parse
from app.decode.kwait import kernel_wait
from app.model import KernelWait, RankSnapshot
from waiting import wait_until
from worker_client import WorkerProc
from worker_targets import Target, proc_state, tracer_pid
from workers import procinfo, pstate
from workers.collect import kwait, procfs

PROG = str(Path(__file__).resolve().parents[1] / "support" / "kwait_target_prog.py")


@contextlib.contextmanager
def target(mode: str, *args: str) -> Iterator[Target]:
    t = Target([sys.executable, PROG, mode, *args])
    try:
        yield t
    finally:
        t.kill()


def in_call(pid: int, names: Sequence[str], tid: int = 0) -> Dict[str, Any]:
    """The thread (pid's main thread by default) once it sleeps in one of these calls: its procfs dict."""
    def blocked() -> Any:
        t = procfs.thread(pid, tid or pid)
        return t if t is not None and t["state"] == "S" and t["syscall"] in names else None

    return wait_until(blocked, 20, f"pid {pid} to sleep in {'/'.join(names)}", interval=0.01)


def waits(pid: int, names: Sequence[str], tid: int = 0) -> Tuple[Dict[str, Any], KernelWait]:
    """What the dump reads: the threads, what holds the process, then kwait.annotate; (the raw dict, decoded)."""
    in_call(pid, names, tid)
    threads = procfs.collect(pid)["threads"]
    kwait.annotate({}, pid, threads, pstate.read(pid, [(t["tid"], t["state"]) for t in threads]))
    raw = next(t for t in threads if t["tid"] == (tid or pid))["waits"]
    decoded = kernel_wait(raw)
    assert decoded is not None, raw
    return raw, decoded


def accepted(server: Target) -> None:
    """The server took the connection (accept returned; it sleeps now)."""
    in_call(server.pid, ["clock_nanosleep", "nanosleep"])


def stat_of(pid: int) -> List[str]:
    return procinfo.stat_fields(pid)


def test_reading_a_pipe_names_its_writer_a_sleeping_child() -> None:
    with target("pipe") as t:
        writer = int(t.ready[1])
        _, w = waits(t.pid, ["read"])
        assert (w.syscall, w.family, w.fd) == ("read", "fd", w.fds[0].fd)
        (fd,) = w.fds
        assert fd.kind == "pipe" and fd.access == "read" and fd.target.startswith("pipe:[") and fd.complete
        (end,) = fd.others
        assert (end.role, end.pid, end.comm, end.ppid, end.own) == ("writer", writer, "sleep", t.pid, False)
        assert end.state == "S" and end.cmdline == ("sleep", "86400") and end.wchan
        assert not fd.nobody


def test_opening_a_fifo_nobody_opens_for_writing_names_the_path_and_nobody(tmp_path: Path) -> None:
    path = str(tmp_path / "ctl.fifo")
    with target("fifo", path) as t:
        raw, w = waits(t.pid, ["open", "openat"])
        assert w.family == "open" and w.path == path, raw
        (fd,) = w.fds
        assert (fd.kind, fd.access, fd.target, fd.fd) == ("fifo", "read", path, None)
        assert fd.others == () and fd.complete and fd.nobody  # nobody holds it: the open waits for ever
        assert proc_state(t.pid) == "S" and tracer_pid(t.pid) == 0  # its memory was read, it never stopped


def test_reading_stdin_a_pipe_from_the_parent_names_the_parent() -> None:
    with target("stdin") as t:
        child = int(t.ready[1])
        _, w = waits(child, ["read"])
        (fd,) = w.fds
        assert fd.fd == 0 and fd.kind == "pipe" and fd.access == "read"
        (end,) = fd.others
        assert (end.role, end.pid, end.own) == ("writer", t.pid, False) and stat_of(child)[3] == str(t.pid)


def test_reading_a_pty_says_a_terminal_and_whether_it_is_the_controlling_one() -> None:
    with target("pty") as t:
        _, w = waits(t.pid, ["read"])
        (fd,) = w.fds
        assert fd.kind == "tty" and fd.target == t.ready[1] and fd.controlling is False and fd.foreground is None
    with target("pty", "--ctty") as t:
        _, w = waits(t.pid, ["read"])
        (fd,) = w.fds
        assert stat_of(t.pid)[6] != "0"  # it acquired the terminal
        assert fd.kind == "tty" and fd.controlling is True and fd.foreground is True  # no SIGTTIN for it


def test_recv_from_a_local_server_that_never_answers_names_the_server() -> None:
    with target("server") as srv:
        port = srv.ready[1]
        with target("recv", f"127.0.0.1:{port}") as t:
            accepted(srv)
            raw, w = waits(t.pid, ["recvfrom", "read", "recvmsg"])
            (fd,) = w.fds
            assert (fd.kind, fd.proto, fd.state, fd.access) == ("socket", "tcp", "ESTABLISHED", "read")
            assert fd.peer == f"127.0.0.1:{port}" and fd.local == f"127.0.0.1:{t.ready[1]}"
            (end,) = fd.others
            assert (end.role, end.pid, end.own) == ("peer", srv.pid, False), raw
            assert "server" in end.cmdline and end.comm.startswith("python")


def test_a_connection_the_server_never_accepted_names_the_listener() -> None:
    with target("server", "--no-accept") as srv:
        port = srv.ready[1]
        in_call(srv.pid, ["clock_nanosleep", "nanosleep"])
        with target("recv", f"127.0.0.1:{port}") as t:
            raw, w = waits(t.pid, ["recvfrom", "read", "recvmsg"])
            (fd,) = w.fds
            assert [(o.role, o.pid) for o in fd.others] == [("listener", srv.pid)], raw
            assert any("accept queue" in n for n in fd.notes)


def test_a_unix_connection_the_server_never_accepted_names_the_listener(tmp_path: Path) -> None:
    """A client's send blocks on a full unix socket whose server has not accepted it: the other end has no file
    yet (no inode, no holder); the listener whose pending connections hold it is the one that can read."""
    path = str(tmp_path / "agent.sock")
    with target("unix_server", path) as srv:
        in_call(srv.pid, ["clock_nanosleep", "nanosleep"])
        with target("unix_send", path) as t:
            raw, w = waits(t.pid, ["sendto", "sendmsg", "write"])
            (fd,) = w.fds
            assert (fd.kind, fd.proto, fd.access) == ("socket", "unix", "write"), raw
            assert [(o.role, o.pid) for o in fd.others] == [("listener", srv.pid)], raw
            assert fd.peer == path and any("accept queue" in n for n in fd.notes), raw


def test_recv_from_a_host_that_is_not_local_gives_only_the_peer_address() -> None:
    with target("udp") as t:
        _, w = waits(t.pid, ["recvfrom", "read", "recvmsg"])
        (fd,) = w.fds
        assert (fd.kind, fd.proto, fd.peer, fd.state) == ("socket", "udp", "192.0.2.1:9", "connected")
        assert fd.others == ()


def test_a_socket_with_a_timeout_polls_it_and_the_poll_names_the_socket_and_its_peer() -> None:
    with target("server") as srv:
        port = srv.ready[1]
        with target("recv", f"127.0.0.1:{port}", "--timeout") as t:
            accepted(srv)
            raw, w = waits(t.pid, ["poll", "ppoll"])
            assert w.family == "poll" and w.fds_total == 1 and w.timeout == pytest.approx(1000.0), raw
            (fd,) = w.fds
            assert (fd.kind, fd.proto, fd.access) == ("socket", "tcp", "read")
            assert [(o.role, o.pid) for o in fd.others] == [("peer", srv.pid)]


def test_a_poll_resumed_after_a_stop_is_read_as_the_poll_it_continues() -> None:
    """A stop (a ptrace attach: py-spy's dump, an earlier sample's or anyone's; here SIGSTOP and SIGCONT) makes a
    poll resume as restart_syscall: its fds and its peer are still read, from the call's own arguments."""
    with target("server") as srv:
        port = srv.ready[1]
        with target("recv", f"127.0.0.1:{port}", "--timeout") as t:
            accepted(srv)
            in_call(t.pid, ["poll"])
            os.kill(t.pid, signal.SIGSTOP)
            wait_until(lambda: proc_state(t.pid) == "T", 10, "the target to stop", interval=0.01)
            os.kill(t.pid, signal.SIGCONT)
            raw, w = waits(t.pid, ["restart_syscall"])
            assert w.syscall == "poll" and w.family == "poll" and w.fds_total == 1, raw
            (fd,) = w.fds
            assert (fd.kind, fd.proto, fd.access) == ("socket", "tcp", "read")
            assert [(o.role, o.pid) for o in fd.others] == [("peer", srv.pid)]
            assert any("restart_syscall" in n for n in w.notes), raw


def test_sigwait_names_the_signals_it_waits_for_and_no_timeout() -> None:
    with target("sigwait") as t:
        raw, w = waits(t.pid, ["rt_sigtimedwait"])
        assert w.family == "signal" and w.signals == ("SIGUSR2", "SIGRTMIN+3") and w.timeout == -1.0, raw


def test_asyncio_waits_in_epoll_on_its_connection_and_names_the_server() -> None:
    with target("server") as srv:
        port = srv.ready[1]
        with target("asyncio", f"127.0.0.1:{port}") as t:
            accepted(srv)
            raw, w = waits(t.pid, ["epoll_wait", "epoll_pwait", "epoll_pwait2"])
            assert w.family == "epoll" and w.timeout == -1 and w.fd is not None
            tcp = [f for f in w.fds if f.proto == "tcp"]
            assert w.fds_total == len(w.fds) >= 2, raw  # the loop's self-pipe (a socketpair) and the connection
            (conn,) = tcp
            assert conn.peer == f"127.0.0.1:{port}" and [(o.role, o.pid) for o in conn.others] == [("peer", srv.pid)]
            assert any(f.proto == "unix" for f in w.fds)


def test_a_unix_socketpair_names_the_process_holding_the_other_end() -> None:
    with target("unix") as t:
        child = int(t.ready[1])
        raw, w = waits(child, ["recvfrom", "read", "recvmsg"])
        (fd,) = w.fds
        assert (fd.kind, fd.proto, fd.state) == ("socket", "unix", "ESTABLISHED"), raw
        assert [(o.role, o.pid) for o in fd.others] == [("peer", t.pid)]


def test_a_peer_reading_its_own_end_of_the_connection_is_marked_reading_and_one_that_sleeps_is_not() -> None:
    """Both ends of a connection asleep reading it wait for each other: the node reads the peer's threads' calls
    (/proc/PID/task/TID/syscall) and marks a peer that reads the fd holding its end; a peer asleep elsewhere
    (time.sleep) is not marked."""
    with target("both_read") as t:
        child = int(t.ready[1])
        in_call(t.pid, ["recvfrom", "read", "recvmsg"])
        raw, w = waits(child, ["recvfrom", "read", "recvmsg"])
        (fd,) = w.fds
        assert [(o.role, o.pid, o.reading) for o in fd.others] == [("peer", t.pid, True)], raw
    with target("unix") as t:
        child = int(t.ready[1])
        in_call(t.pid, ["clock_nanosleep", "nanosleep"])
        raw, w = waits(child, ["recvfrom", "read", "recvmsg"])
        (fd,) = w.fds
        assert [(o.role, o.pid, o.reading) for o in fd.others] == [("peer", t.pid, False)], raw


def test_wait4_on_a_sleeping_child_and_a_zombie_killed_by_sigkill() -> None:
    with target("wait") as t:
        sleeper, victim = int(t.ready[1]), int(t.ready[2])
        _, w = waits(t.pid, ["wait4", "waitid"])
        assert w.family == "wait" and w.child_pid == sleeper and w.children_complete
        first, second = w.children  # the one it waits for first
        assert (first.role, first.pid, first.comm, first.state) == ("child", sleeper, "sleep", "S")
        assert first.exit_signal == "" and first.exit_code is None
        assert (second.pid, second.state, second.exit_signal, second.exit_code) == (victim, "Z", "SIGKILL", None)


def test_wait4_on_a_child_reading_its_input_names_who_holds_the_write_end() -> None:
    """A child blocked reading its stdin pipe gets its end only when every holder of the write end closes it: the
    waiting process itself (it never closed proc.stdin), and a process it forked after making the pipe."""
    with target("wait_fed") as t:
        cat = int(t.ready[1])
        _, w = waits(t.pid, ["wait4", "waitid"])
        child = w.children[0]
        assert (child.pid, child.comm) == (cat, "cat") and child.reads is not None, w
        assert child.reads.kind == "pipe" and child.reads.fd == 0 and child.reads.target.startswith("pipe:[")
        assert [(o.role, o.pid, o.own) for o in child.reads.others] == [("writer", t.pid, True)]
    with target("wait_fed", "fork") as t:
        cat, forked = int(t.ready[1]), int(t.ready[2])
        _, w = waits(t.pid, ["wait4", "waitid"])
        child = next(c for c in w.children if c.pid == cat)
        assert child.reads is not None
        assert sorted((o.pid, o.own) for o in child.reads.others) == sorted([(t.pid, True), (forked, False)])
        assert next(o for o in child.reads.others if o.pid == forked).ppid == t.pid
        # the forked one is a child too, asleep in no pipe read: nothing read for it
        assert all(c.reads is None for c in w.children if c.pid != cat)


def test_wait4_on_any_child_lists_them() -> None:
    with target("wait_any") as t:
        kids = sorted(int(p) for p in t.ready[1:])
        _, w = waits(t.pid, ["wait4", "waitid"])
        assert w.child_pid == -1 and sorted(c.pid for c in w.children) == kids
        assert all(c.role == "child" and c.comm == "sleep" for c in w.children)


@pytest.mark.parametrize("how, call, lock_type", [("flock", "flock", "FLOCK"), ("posix", "fcntl", "POSIX"),
                                                   ("ofd", "fcntl", "OFDLCK")])
def test_a_lock_held_by_another_process_names_the_holder(tmp_path: Path, how: str, call: str, lock_type: str) -> None:
    path = str(tmp_path / "ckpt.lock")
    with target("holder", how, path) as holder, target("waiter", how, path) as t:
        raw, w = waits(t.pid, [call])
        assert (w.family, w.lock_type, w.lock_mode, w.path) == ("lock", lock_type, "WRITE", path), raw
        (fd,) = w.fds
        assert fd.access == "lock" and fd.kind == "file" and fd.complete
        (end,) = fd.others  # an OFD lock has no owning pid: the one other process holding the file open
        assert (end.role, end.pid, end.own) == ("holder", holder.pid, False)
        assert end.lock.startswith(f"{lock_type} WRITE") if how != "ofd" else "holding the file open" in end.lock


def test_a_spinning_thread_gains_cpu_time_and_the_blocked_one_does_not() -> None:
    with target("spin") as t:
        spinner = int(t.ready[1])
        in_call(t.pid, ["read"])

        def cpu() -> Dict[int, float]:
            return {th["tid"]: th["cpu_time"] for th in procfs.collect(t.pid)["threads"]}

        before = cpu()
        wait_until(lambda: cpu()[spinner] >= before[spinner] + 0.2, 30, "the spinner to use 0.2 s of CPU")
        after = cpu()
        assert after[t.pid] == before[t.pid]  # asleep in read: no CPU
        threads = procfs.collect(t.pid)["threads"]
        kwait.annotate({}, t.pid, threads, pstate.read(t.pid))
        spinning = next(th for th in threads if th["tid"] == spinner)
        assert "waits" not in spinning  # running: nothing to wait on, and nothing read for it


def test_the_dump_carries_the_waits_and_the_model_reads_them(tmp_path: Path) -> None:
    """Through the real worker: a rank reading a pipe from a sleeping child and a rank opening a FIFO, dumped
    together (one /proc/*/fd scan for both); the waits reach ThreadStack.waits, the CPU time ThreadStack.cpu_time,
    and the dump records what it read. Nothing is stopped or traced."""
    fifo = str(tmp_path / "in.fifo")
    with target("pipe") as a, target("fifo", fifo) as b, WorkerProc() as w:
        in_call(a.pid, ["read"])
        in_call(b.pid, ["open", "openat"])
        items, done = w.call("dump", {"targets": [{"pid": p, "start_time": procinfo.start_time(p)}
                                                  for p in (a.pid, b.pid)]}, timeout=60)
        assert done["type"] == "done", done
        by_pid = {i["pid"]: i for i in items}
        for pid in (a.pid, b.pid):
            assert any(x.startswith("read what 1 blocked thread waits on (/proc") for x in by_pid[pid]["actions"])
        rank = parse.apply_dump(RankSnapshot(node="n", pid=a.pid, start_time=0), by_pid[a.pid])
        main = next(th for th in rank.threads if th.tid == a.pid)
        assert main.waits is not None and main.waits.fds[0].others[0].pid == int(a.ready[1])
        assert main.cpu_time is not None and main.cpu_time >= 0
        opener = parse.apply_dump(RankSnapshot(node="n", pid=b.pid, start_time=0), by_pid[b.pid])
        assert next(th for th in opener.threads if th.tid == b.pid).waits == kernel_wait(
            next(th for th in by_pid[b.pid]["procfs"]["threads"] if th["tid"] == b.pid)["waits"])
        assert all(tracer_pid(p) == 0 and proc_state(p) == "S" for p in (a.pid, b.pid))


def test_a_poll_loop_sleeping_on_a_file_says_who_holds_that_file_open_for_writing(tmp_path: Path) -> None:
    """Through the real worker with locals: a thread asleep between the checks of `while not _complete(path)`
    holds the file's path in its locals; the node looks up (the /proc/*/fd scan, never the file itself) which
    processes hold it open for writing: none, or the child that does."""
    for with_writer in (False, True):
        path = str(tmp_path / f"tokenizer-{with_writer}.json")
        with target("poll_file", path, *(["writer"] if with_writer else [])) as t, WorkerProc() as w:
            writer = int(t.ready[1])
            for _ in range(20):  # the loop checks every 0.2 s: a dump may catch it between two sleeps
                in_call(t.pid, ["clock_nanosleep", "nanosleep"])
                items, done = w.call("dump", {"targets": [{"pid": t.pid, "start_time": procinfo.start_time(t.pid)}],
                                              "locals": True, "loops": True}, timeout=60)
                assert done["type"] == "done", done
                item = items[0]
                rank = parse.apply_dump(RankSnapshot(node="n", pid=t.pid, start_time=0), item)
                main = next(th for th in rank.threads if th.tid == t.pid)
                if main.waits is not None and main.waits.family == "sleep":
                    break
            assert main.waits is not None and main.waits.family == "sleep", main
            watched = {f.target: f for f in main.waits.watched}
            assert path in watched, (main.waits, item["actions"])
            f = watched[path]
            assert f.complete
            assert [o.pid for o in f.others] == ([writer] if with_writer else []), f
            assert any(a.startswith("looked up which processes hold") for a in item["actions"]), item["actions"]
            assert tracer_pid(t.pid) == 0


def test_a_stopped_process_is_not_read_in_memory_and_says_so(tmp_path: Path) -> None:
    path = str(tmp_path / "x.fifo")
    with target("fifo", path) as t:
        in_call(t.pid, ["open", "openat"])
        os.kill(t.pid, 19)  # SIGSTOP
        wait_until(lambda: proc_state(t.pid) == "T", what="the target stopped")
        threads = procfs.collect(t.pid)["threads"]
        main = next(th for th in threads if th["tid"] == t.pid)
        main["state"] = "S"  # what it was in when read a moment earlier: the hold decides, not the letter
        kwait.annotate({}, t.pid, threads, pstate.read(t.pid))
        w = kernel_wait(main["waits"])
        assert w is not None and w.path == "" and any("memory was not read: the process is stopped" in n
                                                      for n in w.notes)
        assert proc_state(t.pid) == "T"  # left as it was


def test_many_blocked_ranks_share_one_scan() -> None:
    cache: Dict[str, Any] = {}
    with target("pipe") as a, target("pipe") as b:
        for t in (a, b):
            in_call(t.pid, ["read"])
        started = time.monotonic()
        for t in (a, b):
            threads = procfs.collect(t.pid)["threads"]
            kwait.annotate(cache, t.pid, threads, pstate.read(t.pid))
            assert threads[0]["waits"]["fds"][0]["others"][0]["pid"] == int(t.ready[1])
        assert cache["fd_index"].scanned > 0 and time.monotonic() - started < 5
        scanned = cache["fd_index"].scanned
        threads = procfs.collect(a.pid)["threads"]
        kwait.annotate(cache, a.pid, threads, pstate.read(a.pid))
        assert cache["fd_index"].scanned == scanned  # built once per request


def test_socket_helpers_bound_what_they_return() -> None:
    # a socket whose inode is in no table (a netlink socket of this test) says so instead of raising
    nl = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)
    try:
        from workers.collect import fdindex, kwait_net

        inode = os.fstat(nl.fileno()).st_ino
        got = kwait_net.endpoint({}, fdindex.FdIndex(), os.getpid(), inode)
        assert "proto" not in got and "in none of its namespace's" in got["notes"][0]
    finally:
        nl.close()


def test_in_a_container_the_waited_pid_is_its_own_namespaces_and_the_children_are_named(tmp_path: Path) -> None:
    """A rank in its own pid and mount namespaces waits for a child by the pid it knows (its namespace's); the
    worker, outside, names the children by its own pids and puts the waited one first; its pipe's writer is found
    by the same /proc/*/fd scan."""
    if os.getuid() != 0 or not os.path.exists("/usr/bin/unshare"):
        pytest.skip("needs root and unshare for new pid and mount namespaces")
    prefix = ["unshare", "--pid", "--fork", "--mount-proc"]
    with Target([*prefix, sys.executable, PROG, "wait"]) as t:
        assert t.ready[0] == "1"
        inner = int(Path(f"/proc/{t.pid}/task/{t.pid}/children").read_text().split()[0])
        raw, w = waits(inner, ["wait4", "waitid"])
        assert w.child_pid == int(t.ready[1]) and w.child_pid < 10, raw  # the pid as the rank knows it
        sleeper, zombie = w.children
        assert procinfo.ns_id(sleeper.pid) == w.child_pid and sleeper.comm == "sleep"
        assert procinfo.ns_id(zombie.pid) == int(t.ready[2]) and zombie.exit_signal == "SIGKILL"
        assert any("own pid namespace" in n for n in w.notes)
    with Target([*prefix, sys.executable, PROG, "pipe"]) as t:
        inner = int(Path(f"/proc/{t.pid}/task/{t.pid}/children").read_text().split()[0])
        _, w = waits(inner, ["read"])
        (end,) = w.fds[0].others
        assert end.role == "writer" and procinfo.ns_id(end.pid) == int(t.ready[1]) and end.comm == "sleep"


def test_polled_paths_look_up_absolute_names_only_and_skip_what_is_not_a_name_the_kernel_has(tmp_path: Path) -> None:
    """kwait.polled_paths for a stand-in's sleeping thread (its py-spy frames given here), with a child holding one
    file open for writing: quoted absolute paths of a sleeping thread's frames are looked up; a relative path, a
    masked one, /proc, an escaped one, a cut repr and a thread that does not sleep are not."""
    held = tmp_path / "shard-07.done"
    held.write_text("")
    with target("wait") as t:
        writer = subprocess.Popen([sys.executable, "-c", "import sys, time\nf = open(sys.argv[1], 'a')\n"
                                   "print('ok', flush=True)\ntime.sleep(60)", str(held)], stdout=subprocess.PIPE)
        try:
            assert writer.stdout is not None and writer.stdout.readline().strip() == b"ok"
            locals_ = [{"name": n, "repr": r} for n, r in (
                ("marker", f'"{held}"'), ("rel", '"data/x.json"'), ("masked", '"/run/***/token"'),
                ("status", '"/proc/1/status"'), ("esc", '"/tmp/a\\\\nb"'), ("cut", f'"{tmp_path}/very-long...'),
                ("other", f"'{tmp_path / 'nobody-writes'}'"))]
            traces = [{"os_thread_id": t.pid, "frames": [{"name": "wait_done", "locals": locals_}]},
                      {"os_thread_id": t.pid + 1, "frames": [{"name": "x", "locals": locals_}]}]
            threads: List[Dict[str, Any]] = [{"tid": t.pid, "waits": {"family": "sleep"}},
                                             {"tid": t.pid + 1, "waits": {"family": "fd"}}]
            action = kwait.polled_paths({}, t.pid, threads, traces)
        finally:
            writer.kill()
            writer.wait()
    watched = threads[0]["waits"]["watched"]
    assert [w["target"] for w in watched] == [str(held), str(tmp_path / "nobody-writes")], watched
    assert [(o["pid"], o["role"]) for o in watched[0]["others"]] == [(writer.pid, "writer")]
    assert watched[1]["others"] == [] and watched[1]["complete"] is True
    assert "watched" not in threads[1]["waits"] and action is not None and "2 paths" in action


def test_a_futex_shared_between_processes_names_the_file_it_lies_in_and_a_private_one_reads_nothing() -> None:
    """A multiprocessing semaphore is a POSIX named semaphore: its futex lies in /dev/shm and is not private to the
    process (a holder may be another process, or one that ended holding it); a threading.Lock's is private, and
    costs no read at all."""
    with target("shared_semaphore") as t:
        lock_tid = int(t.ready[1])
        # the main thread may first sleep a moment in a private futex (the GIL's hand-over to the other thread): the
        # read that counts is the one taken once it sleeps in the semaphore's (the futex call's own flag says which)
        wait_until(lambda: _shared_call(t.pid), 20, "the main thread to sleep in the semaphore's futex", interval=0.01)
        raw, decoded = waits(t.pid, ["futex"])  # it stays there: nobody posts the semaphore
        assert decoded.family == "futex" and decoded.path.startswith("/dev/shm/sem."), raw
        assert any("shared between processes" in n for n in decoded.notes), raw
        private, _ = waits(t.pid, ["futex"], tid=lock_tid)
        assert "path" not in private and not private.get("notes"), private


def _shared_call(pid: int) -> bool:
    """The main thread sleeps in a futex call whose op, as /proc shows its arguments now, is not FUTEX_PRIVATE
    (flag 128)."""
    t = procfs.thread(pid, pid)
    raw = str(t.get("syscall_raw") or "").split() if t is not None else []
    return t is not None and t["state"] == "S" and t["syscall"] == "futex" and len(raw) > 2 \
        and not int(raw[2], 16) & 128
