"""The wait model (app/analysis/blocking.py, sites.py, release.py): for each family of the wait-site table, the
blocking operation, the resource and who can release it, read from a thread's frames, its kernel state and what
the node found at the call's file descriptor; and the chain of waits to the root.

Stacks are built the way py-spy reports them (innermost first, qualified names, the standard library's paths),
so each case is the table's entry applied to a stack, not a scenario."""

from __future__ import annotations

from dataclasses import replace
from typing import Optional, Sequence, Tuple

import pytest

from app.analysis.blocking import SPIN_PROOF_S, Motion, ThreadWait, call_site, calls, real_syscall, thread_wait
from app.analysis.release import Context, chain, release
from app.analysis.sites import CALL_SITES, FRAME_SITES, RESOURCES, frame_site, kernel_site
from app.model import Frame, JobProcess, KernelWait, Local, LoopInfo, OtherEnd, ProcessHold, RankSnapshot
from app.model import ThreadStack, WaitFd, WithInfo

LIB = "/usr/lib/python3.11"
JOB = "/home/alice/train.py"


def job(function: str, line: int, code: str = "", locals_: Sequence[Tuple[str, str]] = (), **kw: object) -> Frame:
    source = ((line, code),) if code else ()
    return Frame(function, JOB, line, locals=tuple(Local(n, v, True) for n, v in locals_), source=source, **kw)  # type: ignore[arg-type]


def lib(path: str, function: str, line: int = 100, locals_: Sequence[Tuple[str, str]] = ()) -> Frame:
    return Frame(function, f"{LIB}/{path}", line, locals=tuple(Local(n, v, True) for n, v in locals_))


def thread(*frames: Frame, tid: int = 1, name: str = "MainThread", syscall: str = "futex", wchan: str = "futex_do_wait",
           state: str = "S", main: bool = True, waits: Optional[KernelWait] = None) -> ThreadStack:
    return ThreadStack(tid, name, False, False, tuple(frames), state, wchan, syscall, (), main, waits=waits)


def rank(*threads: ThreadStack, pid: int = 100, hold: Optional[ProcessHold] = None) -> RankSnapshot:
    return RankSnapshot(node="node01", pid=pid, start_time=1, rank=3, threads=tuple(threads), hold=hold)


def wait_of(t: ThreadStack, hold: Optional[ProcessHold] = None) -> ThreadWait:
    return thread_wait(t, hold)


# --- the table ----------------------------------------------------------------------------------------------


def test_every_entry_names_a_known_resource_and_a_reason() -> None:
    for site in FRAME_SITES + CALL_SITES:
        assert site.resource in RESOURCES and site.reason and site.operation and site.functions, site
    assert all(site.files for site in FRAME_SITES) and not any(site.files for site in CALL_SITES)


def test_a_qualified_name_picks_its_own_site_before_a_bare_one() -> None:
    assert frame_site("Queue.get", f"{LIB}/multiprocessing/queues.py").operation == "multiprocessing Queue.get"  # type: ignore[union-attr]
    assert frame_site("Queue.get", f"{LIB}/queue.py").operation == "queue.Queue.get"  # type: ignore[union-attr]
    assert frame_site("get", f"{LIB}/queue.py").operation == "queue.Queue.get"  # type: ignore[union-attr]  (old py-spy)
    assert frame_site("helper", f"{LIB}/queue.py") is None
    assert frame_site("Future.result", "/opt/venv/lib/python3.11/concurrent/futures/_base.py") is not None


def test_kernel_sites_match_a_wait_channel_by_its_prefix_only() -> None:
    assert kernel_site("futex", "futex_do_wait")[2] == "native"  # type: ignore[index]  (not do_wait: a child)
    assert kernel_site("wait4", "do_wait")[2] == "child"  # type: ignore[index]
    assert kernel_site("read", "fuse_wait_answer")[2] == "file"  # type: ignore[index]
    assert kernel_site("clock_nanosleep", "get_signal")[4] == "frozen"  # type: ignore[index]  (cgroup v2's trap)
    assert kernel_site("", "__refrigerator")[4] == "frozen"  # type: ignore[index]


def test_a_restarted_call_is_named_after_what_the_thread_sleeps_in() -> None:
    """A ptrace attach (py-spy's, a sample earlier) or a signal makes a poll or a sleep resume as restart_syscall."""
    assert real_syscall("restart_syscall", "poll_schedule_timeout.constprop.0") == "poll"
    assert real_syscall("restart_syscall", "hrtimer_nanosleep") == "clock_nanosleep"
    assert real_syscall("read", "pipe_read") == "read"
    w = wait_of(thread(job("step", 10, "time.sleep(1)"), syscall="restart_syscall", wchan="hrtimer_nanosleep"))
    assert w.operation == "time.sleep" and w.syscall == "clock_nanosleep"


def test_calls_on_a_line_are_read_with_their_receivers() -> None:
    got = [(c.receiver, c.name) for c in calls("    n = self._sock.recv_into(view[got:])")]
    assert got == [("self._sock", "recv_into")]
    assert [(c.receiver, c.name) for c in calls("x = store.wait([f'k_{r}'])")] == [("store", "wait")]


# --- frame sites: the call the job made, not the lock it waits in -------------------------------------------


@pytest.mark.parametrize("frames, operation, resource, rule", [
    ((lib("threading.py", "Condition.wait", 320), lib("concurrent/futures/_base.py", "Future.result", 456),
      job("upload", 80, "fut.result()")), "Future.result", "future", "worker"),
    ((lib("threading.py", "Condition.wait", 320), lib("threading.py", "Event.wait", 629),
      job("get_batch", 20, "self.ready.wait()")), "Event.wait", "event", "notifier"),
    ((lib("threading.py", "Condition.wait", 320), lib("queue.py", "Queue.get", 171), job("next", 5, "q.get()")),
     "queue.Queue.get", "queue", "producer"),
    ((lib("multiprocessing/connection.py", "_recv", 430), lib("multiprocessing/queues.py", "Queue.get", 103),
      job("next", 5)), "multiprocessing Queue.get", "process_queue", "producer"),
    ((lib("subprocess.py", "Popen._try_wait", 2011), lib("subprocess.py", "Popen._wait", 2053),
      lib("subprocess.py", "Popen.wait", 1264), lib("subprocess.py", "run", 550), job("sync", 9, "subprocess.run(cmd)")),
     "subprocess.run", "child", "children"),
    # subprocess.run with its output captured: first it reads the output to its end (EOF), then waits for the exit;
    # the phase below the call says which (a generic selector wait under it says neither)
    ((lib("selectors.py", "_PollLikeSelector.select", 415), lib("subprocess.py", "Popen._communicate", 2108),
      lib("subprocess.py", "Popen.communicate", 1209), lib("subprocess.py", "run", 550),
      job("hook", 9, "res = subprocess.run(cmd, capture_output=True)")), "subprocess.run", "pipe", "output"),
    ((lib("subprocess.py", "Popen._try_wait", 2011), lib("subprocess.py", "Popen._wait", 2053),
      lib("subprocess.py", "Popen.wait", 1264), lib("subprocess.py", "Popen._communicate", 2120),
      lib("subprocess.py", "Popen.communicate", 1209), lib("subprocess.py", "check_output", 466),
      job("hook", 9, "out = subprocess.check_output(cmd)")), "subprocess.run", "child", "children"),
    ((lib("selectors.py", "_PollLikeSelector.select", 415), lib("subprocess.py", "Popen._communicate", 2108),
      lib("subprocess.py", "Popen.communicate", 1209), job("hook", 9, "out, err = proc.communicate()")),
     "subprocess communicate", "pipe", "output"),
    ((lib("selectors.py", "EpollSelector.select", 468), lib("asyncio/base_events.py", "BaseEventLoop._run_once", 1898),
      lib("asyncio/base_events.py", "BaseEventLoop.run_forever", 607),
      lib("asyncio/base_events.py", "BaseEventLoop.run_until_complete", 640), lib("asyncio/runners.py", "Runner.run", 118),
      lib("asyncio/runners.py", "run", 190), job("fetch", 30)), "asyncio.run", "event_loop", "tasks"),
    ((lib("cmd.py", "Cmd.cmdloop", 126), lib("pdb.py", "Pdb._cmdloop", 322), lib("pdb.py", "Pdb.interaction", 426),
      lib("pdb.py", "Pdb.user_line", 257), lib("bdb.py", "Bdb.dispatch_line", 90), lib("bdb.py", "Bdb.trace_dispatch", 70),
      job("on_nan", 44)), "pdb prompt", "debugger", "person"),
    ((lib("socket.py", "SocketIO.readinto", 706), lib("http/client.py", "HTTPResponse._read_status", 286),
      lib("http/client.py", "HTTPResponse.begin", 325), lib("http/client.py", "HTTPConnection.getresponse", 1375),
      job("put", 70)), "HTTP response", "http", "peer"),
])
def test_the_outermost_site_below_the_jobs_code_is_the_operation(frames: tuple, operation: str, resource: str,
                                                                  rule: str) -> None:
    w = wait_of(thread(*frames))
    assert (w.operation, w.resource, w.release, w.by) == (operation, resource, rule, "frame")
    assert w.caller is not None and w.caller.filename == JOB


def test_the_interpreter_shutting_down_waits_for_its_threads() -> None:
    main = thread(lib("threading.py", "_wait_for_tstate_lock", 1132), lib("threading.py", "_shutdown", 1583))
    w = wait_of(main)
    assert (w.operation, w.resource, w.release) == ("interpreter shutdown", "shutdown", "threads")
    flusher = thread(lib("threading.py", "Condition.wait", 320), lib("queue.py", "Queue.get", 171),
                     job("flush", 12, "item = q.get()"), lib("threading.py", "Thread.run", 982), tid=2,
                     name="metrics-flusher", main=False)
    rel = release(w, main, Context(rank(main, flusher)))
    assert [p.name for p in rel.parties] == ["metrics-flusher"] and rel.parties[0].wait.operation == "queue.Queue.get"  # type: ignore[union-attr]


# --- calls into C from a Python line --------------------------------------------------------------------------


@pytest.mark.parametrize("code, locals_, syscall, operation, resource", [
    ("data = conn.recv(4096)", (("conn", "<socket at 0x7f1>"),), "recvfrom", "socket.recv", "socket"),
    ("time.sleep(5)", (), "clock_nanosleep", "time.sleep", "timer"),
    ('answer = input("overwrite? ")', (), "read", "input()", "terminal"),
    ("lock.acquire()", (("lock", "<_thread.lock at 0x7f2>"),), "futex", "Lock.acquire", "lock"),
    ("fcntl.flock(f, fcntl.LOCK_EX)", (), "flock", "fcntl.flock", "file_lock"),
    ("fcntl.lockf(fd, fcntl.LOCK_EX)", (), "fcntl", "fcntl.lockf", "file_lock"),  # F_SETLKW underneath
    ('store.wait(["ckpt/ready"])', (("store", "<torch._C._distributed_c10d.TCPStore at 0x7f3>"),), "recvfrom",
     "store.wait", "store_key"),
    ("os.waitpid(pid, 0)", (), "wait4", "os.waitpid", "child"),
])
def test_a_c_call_is_read_from_the_line_and_checked_against_the_kernel(code: str, locals_: tuple, syscall: str,
                                                                        operation: str, resource: str) -> None:
    w = wait_of(thread(job("step", 10, code, locals_), syscall=syscall, wchan=""))
    assert (w.operation, w.resource, w.by) == (operation, resource, "call"), w


def test_a_call_the_kernel_contradicts_is_not_taken() -> None:
    """`store.wait(...)` on a line, but the thread sleeps in clock_nanosleep: not a store wait."""
    t = thread(job("step", 10, 'store.wait(["k"])', (("store", "<TCPStore at 0x1>"),)), syscall="clock_nanosleep",
               wchan="hrtimer_nanosleep")
    assert call_site(t.frames[0], t.syscall) is None
    assert wait_of(t).operation != "store.wait"


def test_creating_a_process_group_is_a_collective_wait_for_the_other_ranks() -> None:
    """dist.new_group() is itself collective (frames.py's table): a rank that calls it where the others do not
    waits for them (through the store: gloo's mesh, NCCL's unique id), deep in torch's helper. It was "sleeps in
    `_new_process_group_helper` ... the mechanism is not known" (blind groups set, new_group_late)."""
    torch = "site-packages/torch/distributed/distributed_c10d.py"
    for inner in ("_new_process_group_helper", "new_group", "new_subgroups"):
        frames = [lib(torch, inner, 5100)] + ([lib(torch, "new_group", 5000)] if inner != "new_group" else [])
        w = wait_of(thread(*frames, job("before_sync", 169, "self.extra = dist.new_group(ranks)"),
                           syscall="poll", wchan="do_sys_poll"))
        assert (w.operation, w.resource, w.release) == ("new_group", "collective", "ranks"), (inner, w)
        assert not w.detail("key")  # its arguments are the group's, not a store key
        assert w.collective == "new_group" and "every rank" in w.reason


def test_a_store_key_is_read_from_the_call() -> None:
    w = wait_of(thread(job("eval", 7, 'store.wait(["ckpt/step3/path"])', (("store", "<TCPStore at 0x1>"),)),
                       syscall="recvfrom", wchan="sk_wait_data"))
    assert w.detail("key") == '"ckpt/step3/path"'


def test_a_store_key_written_as_an_f_string_is_its_value_where_the_stack_holds_it_else_its_template() -> None:
    """f"ready/{peer}" with the local peer=5 is the key "ready/5"; f"cfg/{self.name}" is built from what no stack
    holds: it is not a key (the braces are no part of it), it stays the template it is, said as such."""
    def wait(code: str, locals_: Tuple[Tuple[str, str], ...]) -> ThreadWait:
        return wait_of(thread(job("sync", 7, code, (("store", "<TCPStore at 0x1>"), *locals_)),
                              syscall="recvfrom", wchan="sk_wait_data"))

    w = wait('store.wait([f"ready/{peer}"])', (("peer", "5"),))
    assert w.detail("key") == '"ready/5"' and not w.detail("key_template")
    w = wait("store.get(f'cfg/{self.name}/{step}')", (("self", "<Cfg at 0x2>"), ("step", "7")))
    assert not w.detail("key") and w.detail("key_template") == "f'cfg/{self.name}/{step}'"
    w = wait('store.get(f"hosts/{host}")', (("host", '"node07"'),))
    assert w.detail("key") == '"hosts/node07"'
    w = wait('store.get(f"shard/{i}")', ())  # its local not read
    assert w.detail("key_template") == 'f"shard/{i}"'
    w = wait('store.get(f"plain")', ())  # an f-string without a placeholder is its text
    assert w.detail("key") == '"plain"'


# --- locks: holders, the waiter itself, signal handlers -------------------------------------------------------


def _with(line: int, item: str, entering: bool) -> Tuple[WithInfo, ...]:
    return (WithInfo(line, line + 3, f"with {item}:", (item,), entering),)


def test_a_non_reentrant_lock_taken_twice_by_one_thread_is_its_own_holder() -> None:
    inner = job("flush", 20, "with _stats_lock:", withs=_with(20, "_stats_lock", True))
    outer = job("restart_window", 40, "self.flush()", withs=_with(38, "_stats_lock", False))
    t = thread(inner, outer)
    w = wait_of(t)
    assert (w.operation, w.resource) == ("with _stats_lock", "lock")
    rel = release(w, t, Context(rank(t)))
    assert [p.same for p in rel.parties] == [True]


def test_a_signal_handler_runs_on_top_of_the_frame_it_interrupted() -> None:
    handler = job("on_sigusr1", 60, "with _ckpt_lock:", (("signum", "10"), ("frame", "<frame at 0x1>")),
                  withs=_with(60, "_ckpt_lock", True))
    interrupted = job("save", 30, "time.sleep(1)", withs=_with(28, "_ckpt_lock", False))
    t = thread(handler, interrupted)
    w = wait_of(t)
    assert w.handler is handler and w.interrupted is interrupted and w.signal == "SIGUSR1"
    assert w.resource == "lock"
    assert release(w, t, Context(rank(t))).parties[0].same  # the interrupted frame holds it


def test_a_lock_held_by_another_thread_leads_to_that_thread_and_what_it_does() -> None:
    waiter = thread(job("log_metrics", 206, "with _metrics_lock:", withs=_with(206, "_metrics_lock", True)))
    holder = thread(lib("threading.py", "Condition.wait", 320), lib("threading.py", "Event.wait", 629),
                    job("save", 202, "self.done.wait()", withs=_with(197, "_metrics_lock", False)), tid=2,
                    name="checkpoint-writer", main=False)
    links = chain(waiter, Context(rank(waiter, holder)))
    assert [link.wait.operation for link in links] == ["with _metrics_lock", "Event.wait"]
    assert links[0].release.parties[0].name == "checkpoint-writer"


# --- what the node read of the call: the other end ------------------------------------------------------------


def test_a_fifo_open_with_nobody_at_the_other_end_is_said_so() -> None:
    fifo = WaitFd(None, "/run/ctl.fifo", "fifo", "read")
    t = thread(job("control", 77, "with open(path) as f:"), syscall="openat", wchan="wait_for_partner",
               waits=KernelWait("openat", "open", fds=(fifo,), path="/run/ctl.fifo"))
    w = wait_of(t)
    assert (w.operation, w.resource, w.release) == ("open() of a FIFO", "pipe", "writer")
    rel = release(w, t, Context(rank(t)))
    assert not rel.parties and rel.nobody


def test_a_file_lock_names_its_holder() -> None:
    holder = OtherEnd("holder", 4242, "compact", "S", cmdline=("compact-metrics", "--every", "60"),
                      lock="FLOCK WRITE 0-EOF")
    t = thread(job("write_metrics", 12, "fcntl.flock(f, fcntl.LOCK_EX)"), syscall="flock", wchan="locks_lock_inode_wait",
               waits=KernelWait("flock", "lock", fd=5, fds=(WaitFd(5, "/var/run/m.lock", "file", "lock",
                                                                   others=(holder,)),),
                                path="/var/run/m.lock", lock_type="FLOCK", lock_mode="WRITE"))
    w = wait_of(t)
    assert (w.operation, w.resource) == ("fcntl.flock", "file_lock")
    rel = release(w, t, Context(rank(t)))
    assert [(p.kind, p.pid, p.name) for p in rel.parties] == [("process", 4242, "compact-metrics --every 60")]


def test_a_child_killed_by_a_signal_is_a_zombie_with_its_signal() -> None:
    zombie = OtherEnd("child", 314, "python3", "Z", ppid=100, exit_signal="SIGSEGV", core_dumped=True)
    t = thread(job("wait_worker", 5, "os.waitpid(pid, 0)"), syscall="wait4", wchan="do_wait",
               waits=KernelWait("wait4", "wait", child_pid=314, children=(zombie,)))
    w = wait_of(t)
    rel = release(w, t, Context(rank(t)))
    assert rel.parties[0].state == "zombie" and rel.parties[0].exit == "killed by SIGSEGV (core dumped)"


def test_a_socket_peer_outside_the_job_is_a_host() -> None:
    sock = WaitFd(7, "socket:[9]", "socket", "read", "tcp", "10.0.0.1:40000", "10.9.9.9:443", "ESTABLISHED")
    t = thread(job("put", 70, "reply = conn.recv(16)", (("conn", "<socket at 0x1>"),)), syscall="recvfrom",
               wchan="sk_wait_data", waits=KernelWait("recvfrom", "fd", fd=7, fds=(sock,)))
    w = wait_of(t)
    rel = release(w, t, Context(rank(t)))
    assert [(p.kind, p.address) for p in rel.parties] == [("host", "10.9.9.9:443")]
    assert w.detail("peer") == "10.9.9.9:443"


def test_a_dataloader_waits_for_its_worker_processes_and_their_own_waits() -> None:
    main = thread(lib("multiprocessing/connection.py", "_poll", 440),
                  Frame("_MultiProcessingDataLoaderIter._try_get_data",
                        "/opt/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py", 1133),
                  Frame("_MultiProcessingDataLoaderIter._next_data",
                        "/opt/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py", 1295),
                  job("train", 50, "for batch in loader:"))
    worker_main = thread(job("wait_for_shard", 33, "time.sleep(0.5)",
                             loops=(LoopInfo("while", 31, 34, "while os.path.exists(lock):"),)),
                         syscall="clock_nanosleep", wchan="hrtimer_nanosleep")
    worker = JobProcess("node01", 812, 1, "child", "data-loader worker", of=(100,), threads=(worker_main,))
    links = chain(main, Context(rank(main), processes=(worker,)))
    assert links[0].wait.operation == "DataLoader next batch"
    assert links[0].release.parties[0].pid == 812
    assert links[1].wait.operation == "time.sleep" and links[1].wait.poll is not None


def _communicating() -> ThreadStack:
    return thread(lib("selectors.py", "_PollLikeSelector.select", 415), lib("subprocess.py", "Popen._communicate", 2108),
                  lib("subprocess.py", "Popen.communicate", 1209), lib("subprocess.py", "run", 550),
                  job("hook", 9, "res = subprocess.run(cmd, capture_output=True)"), syscall="restart_syscall",
                  wchan="poll_schedule_timeout.constprop.0")


def test_a_phase_of_a_call_keeps_the_calls_own_name_and_argument() -> None:
    t = thread(lib("subprocess.py", "Popen._try_wait", 2011), lib("subprocess.py", "Popen.wait", 1264),
               lib("subprocess.py", "Popen._communicate", 2120), lib("subprocess.py", "Popen.communicate", 1209),
               lib("subprocess.py", "check_output", 466), job("hook", 9, "out = subprocess.check_output(cmd)"))
    w = wait_of(t)
    assert (w.operation, w.resource, w.detail("argument")) == ("subprocess.run", "child", "cmd")


def test_a_childs_output_that_never_ends_after_its_exit_is_held_by_what_it_started() -> None:
    """communicate() reads until every holder of the pipe's write end closes it: a child that has exited (a zombie
    not reaped yet, since the exit is waited for after the output) while the read still waits leaves a process it
    started holding the pipe. A live child is the writer itself; the node's read of the fd, when it has one,
    names the holders."""
    main = _communicating()
    w = wait_of(main)
    gone = JobProcess("node01", 367, 1, "child", "subprocess", of=(100,), state="Z")
    rel = release(w, main, Context(rank(main), processes=(gone,)))
    assert rel.none == "inherited" and [p.pid for p in rel.parties] == [367] and rel.parties[0].state == "zombie"
    alive = JobProcess("node01", 368, 1, "child", "subprocess", of=(100,), state="S", cmdline=("aws", "s3", "cp"))
    rel = release(w, main, Context(rank(main), processes=(alive,)))
    assert rel.none == "" and [p.pid for p in rel.parties] == [368]
    pipe = WaitFd(5, "pipe:[77]", "pipe", "read", others=(OtherEnd("writer", 400, "ckpt-indexer", "S"),))
    read = replace(main, syscall="poll", waits=KernelWait("poll", "fd", fd=5, fds=(pipe,)))
    rel = release(wait_of(read), read, Context(rank(read), processes=(gone,)))
    assert [(p.pid, p.role) for p in rel.parties] == [(400, "writer")]


def test_a_pool_whose_workers_all_wait_for_a_task_will_never_give_the_result() -> None:
    """Pool.map waits for results while every worker process waits for its next task: none runs the call (a pool
    replaces a worker that was killed, and the task it held is lost). One worker still at work is the one."""
    main = thread(lib("threading.py", "Condition.wait", 320), lib("multiprocessing/pool.py", "MapResult.get", 768),
                  lib("multiprocessing/pool.py", "Pool.map", 367), job("tokenize", 40, "out = pool.map(f, chunks)"))

    def worker(pid: int, *top: Frame) -> JobProcess:
        t = thread(*top, lib("multiprocessing/pool.py", "worker", 114), lib("multiprocessing/process.py",
                   "BaseProcess._bootstrap", 314), tid=pid)
        return JobProcess("node01", pid, 1, "child", "multiprocessing child", of=(100,), state="S", threads=(t,))

    idle = [worker(115, lib("multiprocessing/connection.py", "Connection._recv", 395),
                   lib("multiprocessing/queues.py", "SimpleQueue.get", 364)),
            worker(125, lib("multiprocessing/synchronize.py", "SemLock.__enter__", 95),
                   lib("multiprocessing/queues.py", "SimpleQueue.get", 363))]
    w = wait_of(main)
    assert (w.resource, w.release) == ("pool", "worker")
    rel = release(w, main, Context(rank(main), processes=tuple(idle)))
    assert rel.none == "workers_idle" and sorted(p.pid for p in rel.parties) == [115, 125]
    busy = worker(130, job("tokenize_chunk", 12, "return len(text.split())"))
    rel = release(w, main, Context(rank(main), processes=(idle[0], busy)))
    assert rel.none == "" and 130 in [p.pid for p in rel.parties]


# --- states ---------------------------------------------------------------------------------------------------


def test_a_process_state_outranks_any_stack() -> None:
    t = thread(job("step", 10, "time.sleep(1)"), syscall="clock_nanosleep", wchan="do_signal_stop", state="T")
    assert wait_of(t, ProcessHold(kind="stopped")).state == "stopped"
    frozen = thread(job("step", 10, "x = 1"), syscall="clock_nanosleep", wchan="get_signal", state="S")
    assert wait_of(frozen).state == "frozen"  # the cgroup v2 freezer's trap, with no hold read
    d = thread(job("read_shard", 4, "data = f.read()"), syscall="read", wchan="fuse_wait_answer", state="D")
    assert (wait_of(d).state, wait_of(d).resource) == ("disk", "file")


def test_a_native_frame_that_names_the_wait_outranks_the_lines_text() -> None:
    """With --native, py-spy's C++ frames below the Python line say what the call is."""
    native = (Frame("c10d::TCPStore::doWait(...)", "libtorch_cpu.so", 0, native=True),
              Frame("c10d::TCPStore::wait(...)", "libtorch_cpu.so", 0, native=True))
    w = wait_of(thread(*native, job("eval", 7, "ok = fetch()"), syscall="poll", wchan="do_sys_poll"))
    assert (w.operation, w.resource, w.release) == ("store.wait", "store_key", "key_setter")


# --- the CPU ------------------------------------------------------------------------------------------------

def _polling(below: Tuple[Frame, ...], line: int = 40) -> ThreadStack:
    loop = LoopInfo("while", 40, 41, "while not os.path.exists(marker):")
    frame = job("wait_marker", line, "while not os.path.exists(marker):" if line == 40 else "n += 1", loops=(loop,))
    return thread(*below, frame, syscall="running", wchan="", state="R")


@pytest.mark.parametrize("below", [(), (lib("genericpath.py", "exists"),)])
def test_a_thread_runnable_at_its_own_while_loop_in_two_samples_spins_whatever_its_cpu_share(below: tuple) -> None:
    """On a loaded machine a spinning thread gets a fraction of a core: runnable at the same line of its own
    `while` in both samples says it does not wait. A call the loop's header makes to test its condition (the
    library's `exists` caught on top) is the loop itself."""
    stayed = Motion(cpu=0.05, moved=True, moved_own=False, running_before=True)
    w = thread_wait(_polling(below), motion=stayed)
    assert (w.state, w.resource, w.poll is not None) == ("spinning", "cpu", True), w
    # asleep before, or somewhere else in the job's code before: no such evidence, and 5 % of a core is not a spin
    for motion in (Motion(cpu=0.05, moved=True, moved_own=True, running_before=True),
                   Motion(cpu=0.05, moved=False, moved_own=False, running_before=False)):
        assert thread_wait(_polling(below), motion=motion).state == "running"


def test_library_code_below_a_loops_body_line_computes_and_is_no_spin() -> None:
    """The same thread on its loop's body line, inside a library call: that call may be doing the work."""
    stayed = Motion(cpu=0.2, moved=True, moved_own=False, running_before=True)
    assert thread_wait(_polling((lib("json/decoder.py", "decode"),), line=41), motion=stayed).state == "running"


def _body(body: Tuple[Tuple[int, str], ...]) -> ThreadStack:
    loop = LoopInfo("while", 642, 642 + len(body), "while not self.flushed:")
    source = ((642, "        while not self.flushed:  # the writer sets it"),) + body
    frame = Frame("BufferedLog.flush", JOB, 643, source=source, loops=(loop,))
    return thread(frame, syscall="running", wchan="", state="R")


@pytest.mark.parametrize("body", [((643, "            pass"),),
                                  ((643, "            ...  # nothing to do"), (644, ""), (645, "            continue"))])
def test_a_thread_on_the_body_of_a_while_loop_that_does_nothing_spins_as_on_its_header(body: tuple) -> None:
    """`while not done: pass` is sampled at its header or at its `pass`, as py-spy happens to fall: at either it
    only tests its condition. A fifth of a core (a loaded node), just caught there: spinning."""
    fresh = Motion(cpu=0.22, moved=False, moved_own=False, running_before=True)
    w = thread_wait(_body(body), motion=fresh)
    assert (w.state, w.poll is not None) == ("spinning", True), w


def test_a_while_loops_body_that_computes_or_is_not_all_in_the_source_is_no_proof_of_a_spin() -> None:
    fresh = Motion(cpu=0.22, moved=False, moved_own=False, running_before=True)
    assert thread_wait(_body(((643, "            n = step(n)"),)), motion=fresh).state == "running"
    unread = _body(((643, "            pass"),))
    frame = unread.frames[0]
    wider = LoopInfo("while", 642, 650, "while not self.flushed:")  # lines 644-650 not in the frame's source
    partial = thread(Frame(frame.function, frame.filename, 643, source=frame.source, loops=(wider,)),
                     syscall="running", wchan="", state="R")
    assert thread_wait(partial, motion=fresh).state == "running"


# --- waits that poll on a CPU ---------------------------------------------------------------------------------


def _native(function: str, lib_path: str = "/usr/lib/x86_64-linux-gnu/libcuda.so.580") -> Frame:
    return Frame(function, lib_path, 0, lib_path, native=True)


def test_a_thread_polling_the_gpu_in_a_synchronisation_waits_for_it_and_does_not_spin() -> None:
    """The CUDA runtime polls the GPU on a core while the host waits (seen on an H100: a rank in
    torch.cuda.synchronize at 1.9 cores, state R, was called spinning in its own loop)."""
    at = job("main", 107, "sync()", loops=(LoopInfo("for", 93, 110, "for step in range(1, 1_000_000):"),))
    frames = (_native("0x7f96c0bd36bd"), _native("cuCtxSynchronize_v2"),
              _native("cudaDeviceSynchronize", "/x/nvidia/cu13/lib/libcudart.so.13"),
              Frame("synchronize", "/x/site-packages/torch/cuda/__init__.py", 1162), at)
    hot = Motion(cpu=1.9, running_before=True, moved_own=False)
    w = thread_wait(thread(*frames, syscall="running", wchan="", state="R"), motion=hot)
    assert (w.state, w.resource, w.operation) == ("blocked", "device", "cudaDeviceSynchronize")
    assert "polls the GPU on a CPU core" in w.reason and w.caller == at
    # without --native: the Python site says it
    w = thread_wait(thread(*frames[3:], syscall="running", wchan="", state="R"), motion=hot)
    assert (w.state, w.resource, w.operation) == ("blocked", "device", "torch.cuda.synchronize")
    # a wait that sleeps does not poll: a thread on a CPU in its own loop still spins
    spin = thread_wait(thread(job("main", 12, "while not done: pass", loops=(LoopInfo("while", 12, 12, "while not done:"),)),
                              syscall="running", wchan="", state="R"), motion=hot)
    assert spin.state == "spinning"


def test_a_thread_on_a_cpu_in_a_loops_body_computes_until_it_has_stood_there_long() -> None:
    """A matrix product runs in C under one Python line: a rank computing a long step and a rank spinning at that
    line look alike over two samples a second apart. It spins when it tests its loop's condition (the `while`
    header), or once it has stood at that line SPIN_PROOF_S; before that it runs (computing, or not yet known)."""
    body = job("step", 318, "a = torch.tanh(a @ a * 0.01)",
               loops=(LoopInfo("while", 317, 318, "while time.monotonic() < until:"),))
    t = thread(body, syscall="running", wchan="", state="R")
    short = thread_wait(t, motion=Motion(cpu=0.9, running_before=True, stayed_s=1.2))
    assert short.state == "running" and "running Python or native code" in short.reason
    long = thread_wait(t, motion=Motion(cpu=0.9, running_before=True, stayed_s=SPIN_PROOF_S + 1))
    assert long.state == "spinning"
    # at the loop's own condition it spins at once: a computation does not stand on a `while` header
    header = job("wait_marker", 12, "while not os.path.exists(p):", loops=(LoopInfo("while", 12, 12,
                                                                                     "while not os.path.exists(p):"),))
    assert thread_wait(thread(header, syscall="running", wchan="", state="R"),
                       motion=Motion(cpu=0.9, running_before=True, stayed_s=1.0)).state == "spinning"
    # no loop: a long call, until it has stood there long enough to be something that does not end
    plain = thread(job("main", 40, "model(x)"), syscall="running", wchan="", state="R")
    assert thread_wait(plain, motion=Motion(cpu=1.0, running_before=True, stayed_s=2.0)).state == "running"
    assert thread_wait(plain, motion=Motion(cpu=1.0, running_before=True, stayed_s=30.0)).state == "spinning"


def test_a_future_whose_executors_threads_all_wait_for_work_is_not_running() -> None:
    """An executor's worker threads all idle while a caller waits on a future: the call is not running (said as
    such, not 'which its thread runs')."""
    from app.analysis.prose.waits import release as release_text
    from app.analysis.release import Link, Party

    main = thread(lib("threading.py", "Condition.wait", 320), lib("concurrent/futures/_base.py", "Future.result", 456),
                  job("upload", 80, "fut.result()"))
    idle = thread(lib("threading.py", "Condition.wait", 320), lib("queue.py", "SimpleQueue.get", 171),
                  lib("concurrent/futures/thread.py", "_worker", 81), lib("threading.py", "Thread.run", 982), tid=2,
                  name="ThreadPoolExecutor-0_0", main=False)
    w = wait_of(main)
    r = rank(main, idle)
    rel = release(w, main, Context(r))
    assert rel.none == "workers_idle" and [p.name for p in rel.parties] == ["ThreadPoolExecutor-0_0"]
    text = release_text(Link(Party("thread", "node01", 100, 1, 3, role="waiter"), w, rel), r)
    assert "all idle" in text and "the call is not running" in text and "runs" not in text.split("(")[0], text
