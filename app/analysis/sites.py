"""Wait sites: the blocking calls of Python's standard library and of the libraries training jobs use, as a table.

A thread that does not move is inside some call that waits. Which call, and so what it waits for, is read off
its stack by this table, never by a rule named after a scenario: knowledge of a library is an entry here with
the reason beside it (pystack keeps its frame knowledge the same way, as tables beside its types).

Three kinds of entry, tried in this order by app/analysis/blocking.py:

- `FRAME_SITES`: a Python function of a library (file suffix, function names): `Future.result` in
  concurrent/futures/_base.py waits on a future. The outermost matching frame below the job's own code is the
  call the job made (it called `Future.result`, which waits in `Condition.wait`); the innermost one says how.
- `CALL_SITES`: a call into C that leaves no Python frame of its own (`sock.recv(...)`, `time.sleep(...)`,
  `input()`, `lock.acquire()`, `store.wait([...])`): the innermost Python frame stands at the line that made
  it, so the call is read from that line's text, checked against the receiver's type (from the locals, when
  collected) and against the system call the thread sleeps in.
- `KERNEL_SITES`: what the kernel says when nothing above names the call: the system call and the kernel
  function the thread sleeps in (wchan), e.g. `wait4` waits for a child, `flock` for a file lock.

Each entry names the resource (a closed set, `Resource`) and who can release it (`Release`): the rule
app/analysis/release.py follows to find that thread, process, rank or host.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import FrozenSet, Literal, Optional, Tuple, get_args

# What a thread can wait on. Each kind has its own way to find who releases it (Release).
Resource = Literal[
    "lock",  # a threading lock (Lock, RLock, the lock under a `with`): its holder releases it
    "condition",  # a Condition: a thread that notifies it
    "event",  # an Event: a thread that sets it
    "semaphore",  # a Semaphore: a thread that releases a permit
    "barrier",  # a threading.Barrier: the other parties
    "thread",  # Thread.join: the thread joined ends
    "future",  # a concurrent.futures Future: the executor's worker that runs its call
    "queue",  # a queue.Queue (get: a producer; put on a full queue: a consumer)
    "process_queue",  # a multiprocessing queue, pipe or connection: the process at its other end
    "pool",  # a multiprocessing Pool result: the pool's worker processes
    "socket",  # a socket: its peer (a rank, a local service, a host outside the job)
    "http",  # an HTTP request in flight: the server at the socket's other end
    "pipe",  # a pipe: its writer (read) or reader (write)
    "terminal",  # a terminal or stdin: whoever should type or write to it (a person, a parent)
    "child",  # a child process: it must exit (subprocess, os.waitpid, Process.join)
    "file_lock",  # flock/fcntl locks and lock-file libraries: the process that holds the lock
    "file",  # a file or file system call (D state): the file system or device
    "store_key",  # a key of torch.distributed's store: the rank that should set it
    "collective",  # a torch.distributed collective: the ranks not in it yet
    "p2p",  # send/recv: the peer rank
    "device",  # a GPU synchronisation: the device's work (kernels, NCCL)
    "timer",  # a sleep: time itself; in a loop, whatever the loop polls for
    "cpu",  # running on a CPU without waiting (a spin, or a long computation)
    "debugger",  # a debugger's prompt: a person at the terminal
    "shutdown",  # the interpreter exiting: it waits for its non-daemon threads
    "event_loop",  # an asyncio loop with nothing ready: the task or I/O it waits for
    "signal",  # signal.pause / sigwait: a signal
    "native",  # C code that waits for something no Python API shows
    "gil",  # the GIL, held by a thread asleep in native code
    "unknown",  # no site names it: the kernel's facts are all there is
]
RESOURCES: Tuple[str, ...] = get_args(Resource)

# Who can release a wait: the rule app/analysis/release.py follows.
Release = Literal[
    "holder",  # the thread holding the lock (a `with` body of the same lock), possibly the waiter itself
    "notifier",  # another thread of the process (sets the event, notifies the condition, releases a permit)
    "joined",  # the thread being joined
    "worker",  # the executor's worker threads or processes
    "producer",  # threads (queue.Queue) or processes (multiprocessing) that put into it
    "consumer",  # threads that take from a full queue
    "children",  # the process's children
    "output",  # the processes holding the write end of a child's output pipes: the child and what it started
    "peer",  # the socket's other end
    "writer",  # the process holding the pipe or terminal's write end, or a person
    "reader",  # the process holding the pipe's read end
    "lock_holder",  # the process holding the file lock
    "key_setter",  # the rank that sets the store key
    "ranks",  # the ranks of the collective not in it yet
    "peer_rank",  # the rank named by the p2p call's argument
    "device",  # the GPU
    "time",  # nobody: the wait ends by itself (a sleep); in a loop, what the loop waits for
    "itself",  # the thread itself (a spin: its loop's condition)
    "person",  # a person at a terminal
    "threads",  # the process's non-daemon threads
    "importer",  # the thread importing the module whose import lock it waits for
    "tasks",  # the event loop's tasks and I/O
    "kernel",  # the kernel, a file system or a driver
    "unknown",
]


@dataclass(frozen=True)
class Site:
    """One blocking call of a library: where it is, what a user knows it as, what it waits on and why."""

    files: Tuple[str, ...]  # file suffixes ("/"-separated), or () for CALL_SITES
    functions: FrozenSet[str]  # bare or qualified names (py-spy 0.4 gives `Future.result`)
    operation: str  # as the user knows it: "Future.result", "queue.Queue.get"
    resource: Resource
    release: Release
    reason: str  # what the call waits for, in the library's own terms
    # CALL_SITES only: a pattern the receiver's repr (from the locals) must match when it is known, and the
    # system calls a thread inside it can sleep in (an empty tuple: any)
    receiver: str = ""
    syscalls: Tuple[str, ...] = ()
    module: str = ""  # CALL_SITES: the module the function is called through (`time.sleep`), "" for methods
    timeout: str = ""  # the local that holds the call's timeout ("timeout"), when it has one
    generic: bool = False  # a low-level wait under many APIs (Condition.wait): a higher site says more
    # a call that waits for several things in turn (subprocess.run: the child's output to end, then its exit): the
    # innermost specific site below it says which one the thread is in; the operation stays the call the job made
    phased: bool = False
    # CALL_SITES: the system call alone confirms the call whatever its receiver is called (its name need not look
    # like the site's kind when its type is not in the locals): the thread must sleep in one of `syscalls`
    kernel_confirms: bool = False


def _site(files: Tuple[str, ...], functions: str, operation: str, resource: Resource, release: Release, reason: str,
          **kw: object) -> Site:
    return Site(files, frozenset(functions.split()), operation, resource, release, reason, **kw)  # type: ignore[arg-type]


_THREADING = ("threading.py",)
_FUTURES = ("concurrent/futures/_base.py",)
_MP = "multiprocessing/"

FRAME_SITES: Tuple[Site, ...] = (
    # --- threading: every wait below is a lock or a Condition in the end; the outer name says what for
    _site(_THREADING, "Condition.wait Condition.wait_for wait wait_for", "Condition.wait", "condition", "notifier",
          "waits until another thread calls notify() on the condition", timeout="timeout", generic=True),
    _site(_THREADING, "Event.wait", "Event.wait", "event", "notifier",
          "waits until another thread calls set() on the event", timeout="timeout"),
    _site(_THREADING, "Semaphore.acquire BoundedSemaphore.acquire", "Semaphore.acquire", "semaphore", "notifier",
          "waits for a permit that a thread holding one gives back with release()", timeout="timeout"),
    _site(_THREADING, "Barrier.wait Barrier._wait", "Barrier.wait", "barrier", "notifier",
          "waits until every party of the barrier has called wait()", timeout="timeout"),
    _site(_THREADING, "Thread.join", "Thread.join", "thread", "joined", "waits until the joined thread ends",
          timeout="timeout"),
    _site(_THREADING, "_shutdown", "interpreter shutdown", "shutdown", "threads",
          "the main program has ended; the interpreter waits for every non-daemon thread to end before it exits"),
    _site(_THREADING, "Thread._wait_for_tstate_lock _wait_for_tstate_lock", "Thread.join", "thread", "joined",
          "waits for a thread's end (Thread.join, or the interpreter's shutdown)", generic=True),
    _site(_THREADING, "RLock.acquire _RLock.acquire", "RLock.acquire", "lock", "holder",
          "waits for a reentrant lock that another thread holds", timeout="timeout"),
    _site(_THREADING, "Timer.run", "threading.Timer", "timer", "time", "a Timer thread sleeping until it fires"),
    # idle workers of executors and pools: they wait for work, which is not a hang of theirs
    _site(("concurrent/futures/thread.py",), "_worker", "executor worker idle", "queue", "producer",
          "an idle ThreadPoolExecutor worker waits for the next submitted call"),
    _site(("concurrent/futures/process.py",), "_process_worker", "process pool worker idle", "process_queue",
          "producer", "an idle ProcessPoolExecutor worker waits for the next submitted call"),
    _site((_MP + "pool.py",), "worker", "pool worker idle", "process_queue", "producer",
          "an idle multiprocessing Pool worker waits for the next task"),
    # --- queue
    _site(("queue.py",), "Queue.get get", "queue.Queue.get", "queue", "producer",
          "waits until another thread puts an item into the queue", timeout="timeout"),
    _site(("queue.py",), "Queue.put put", "queue.Queue.put", "queue", "consumer",
          "the queue is full: waits until another thread takes an item out", timeout="timeout"),
    _site(("queue.py",), "Queue.join", "queue.Queue.join", "queue", "consumer",
          "waits until every item put has been marked done by the consumers"),
    # --- concurrent.futures
    _site(_FUTURES, "Future.result result", "Future.result", "future", "worker",
          "waits until the executor's worker finishes the submitted call (or it raises)", timeout="timeout"),
    _site(_FUTURES, "Future.exception", "Future.exception", "future", "worker",
          "waits until the executor's worker finishes the submitted call", timeout="timeout"),
    _site(_FUTURES, "wait", "concurrent.futures.wait", "future", "worker",
          "waits until the futures complete (as return_when says)", timeout="timeout"),
    _site(_FUTURES, "as_completed", "concurrent.futures.as_completed", "future", "worker",
          "waits for the next of the futures to complete", timeout="timeout"),
    _site(("concurrent/futures/thread.py",), "ThreadPoolExecutor.shutdown shutdown", "ThreadPoolExecutor.shutdown",
          "future", "worker", "waits until the executor's workers have run every submitted call"),
    _site(("concurrent/futures/process.py",), "ProcessPoolExecutor.shutdown shutdown",
          "ProcessPoolExecutor.shutdown", "future", "worker",
          "waits until the pool's worker processes have run every submitted call"),
    # --- multiprocessing
    _site((_MP + "queues.py",), "Queue.get get", "multiprocessing Queue.get", "process_queue", "producer",
          "waits for an item that another process puts into the queue (through a pipe)", timeout="timeout"),
    _site((_MP + "queues.py",), "Queue.put put", "multiprocessing Queue.put", "process_queue", "consumer",
          "the queue is full: waits until another process takes an item", timeout="timeout"),
    _site((_MP + "queues.py",), "JoinableQueue.join", "multiprocessing JoinableQueue.join", "process_queue",
          "consumer", "waits until the consumers mark every item done"),
    _site((_MP + "connection.py",), "Connection.recv Connection.recv_bytes recv recv_bytes _recv _recv_bytes",
          "multiprocessing Connection.recv", "process_queue", "producer",
          "waits for a message from the process at the other end of the connection"),
    _site((_MP + "connection.py",), "Connection.poll poll _poll wait", "multiprocessing.connection.wait",
          "process_queue", "producer", "waits until a connection has data from the process at its other end",
          timeout="timeout", generic=True),
    _site((_MP + "pool.py",), "ApplyResult.get ApplyResult.wait MapResult.get get wait Pool.map Pool.starmap map "
          "starmap Pool.join join", "multiprocessing Pool result", "pool", "worker",
          "waits until the pool's worker processes return the results", timeout="timeout"),
    _site((_MP + "process.py",), "BaseProcess.join join", "multiprocessing Process.join", "child", "children",
          "waits until the child process exits", timeout="timeout"),
    _site((_MP + "popen_fork.py", _MP + "popen_spawn_posix.py", _MP + "popen_forkserver.py"),
          "Popen.wait Popen.poll wait poll", "multiprocessing Process.join", "child", "children",
          "waits until the child process exits", generic=True),
    _site((_MP + "synchronize.py",), "SemLock.__enter__ Lock.__enter__ RLock.__enter__ __enter__",
          "multiprocessing Lock", "lock", "holder", "waits for a lock shared between processes"),
    _site((_MP + "synchronize.py",), "Event.wait Condition.wait Barrier.wait wait", "multiprocessing Event.wait",
          "event", "notifier", "waits until another process sets the event", timeout="timeout"),
    _site((_MP + "managers.py",), "BaseProxy._callmethod _callmethod", "multiprocessing manager call",
          "process_queue", "peer", "waits for the manager process to answer a call"),
    # --- subprocess and os
    _site(("subprocess.py",), "Popen.wait Popen._wait wait _wait _try_wait Popen._try_wait", "subprocess wait",
          "child", "children", "waits until the child process exits", timeout="timeout"),
    # communicate() reads the child's output pipes to their end (EOF), then waits for its exit (Popen.wait above):
    # EOF comes when every process holding a write end has closed it, the child and anything it started that
    # inherited the pipe (a daemon it left behind keeps the pipe open after the child has exited)
    _site(("subprocess.py",), "Popen._communicate _communicate", "subprocess communicate", "pipe", "output",
          "reads the child's output until every process holding the pipe's write end has closed it (EOF): the "
          "child, and any process it started that inherited the pipe", timeout="timeout"),
    _site(("subprocess.py",), "Popen.communicate communicate", "subprocess communicate", "child", "children",
          "reads the child's output to its end, then waits for its exit", timeout="timeout", phased=True),
    _site(("subprocess.py",), "run check_output check_call call", "subprocess.run", "child", "children",
          "runs a command and waits until it exits", timeout="timeout", phased=True),
    _site(("os.py",), "_spawnvef spawnv spawnve spawnvp", "os.spawn", "child", "children",
          "waits until the spawned process exits"),
    # --- sockets, selectors, ssl, http
    _site(("socket.py",), "SocketIO.readinto readinto", "socket read", "socket", "peer",
          "waits for bytes from the socket's peer"),
    _site(("socket.py",), "socket.accept accept", "socket.accept", "socket", "peer",
          "waits for a client to connect to a listening socket"),
    _site(("socket.py",), "create_connection", "socket.create_connection", "socket", "peer",
          "waits for the server to accept the connection", timeout="timeout"),
    _site(("ssl.py",), "SSLSocket.recv SSLSocket.recv_into SSLSocket.read recv recv_into read", "ssl read",
          "socket", "peer", "waits for TLS records from the socket's peer"),
    _site(("ssl.py",), "SSLSocket.do_handshake do_handshake SSLSocket.connect connect", "ssl handshake",
          "socket", "peer", "waits for the server's side of the TLS handshake"),
    _site(("http/client.py",), "HTTPResponse.begin HTTPResponse._read_status begin _read_status "
          "HTTPConnection.getresponse getresponse", "HTTP response", "http", "peer",
          "sent a request and waits for the server's response"),
    _site(("http/client.py",), "HTTPResponse.read HTTPResponse._safe_read HTTPResponse.readinto read "
          "_safe_read readinto _read_chunked", "HTTP body read", "http", "peer",
          "waits for the rest of the response body from the server"),
    _site(("http/client.py",), "HTTPConnection.connect connect", "HTTP connect", "http", "peer",
          "waits for the server to accept the connection"),
    _site(("urllib/request.py",), "urlopen OpenerDirector.open", "urllib.request.urlopen", "http", "peer",
          "waits for an HTTP server"),
    _site(("urllib3/connectionpool.py",), "HTTPConnectionPool.urlopen HTTPConnectionPool._make_request urlopen "
          "_make_request", "urllib3 request", "http", "peer", "waits for an HTTP server (requests, boto3, ...)"),
    _site(("requests/sessions.py", "requests/api.py"), "Session.request Session.send request send get post put",
          "requests call", "http", "peer", "waits for an HTTP server"),
    _site(("botocore/endpoint.py", "botocore/httpsession.py"), "Endpoint._send Endpoint.make_request "
          "URLLib3Session.send _send make_request send", "botocore request", "http", "peer",
          "waits for an object store or AWS service (S3, ...)"),
    _site(("selectors.py",), "EpollSelector.select PollSelector.select SelectSelector.select "
          "DefaultSelector.select select", "selector wait", "socket", "peer",
          "waits until one of the registered file descriptors is ready", timeout="timeout", generic=True),
    # --- asyncio
    _site(("asyncio/base_events.py",), "BaseEventLoop.run_until_complete run_until_complete",
          "asyncio run_until_complete", "event_loop", "tasks",
          "runs the event loop until the awaited future completes"),
    _site(("asyncio/base_events.py",), "BaseEventLoop.run_forever run_forever", "asyncio run_forever",
          "event_loop", "tasks", "runs the event loop until it is stopped"),
    _site(("asyncio/runners.py",), "run Runner.run", "asyncio.run", "event_loop", "tasks",
          "runs a coroutine on a new event loop until it completes"),
    _site(("asyncio/base_events.py",), "BaseEventLoop._run_once _run_once", "asyncio event loop", "event_loop",
          "tasks", "waits until a timer is due or a file descriptor is ready", generic=True),
    # --- debuggers and interactive prompts
    _site(("pdb.py",), "Pdb.interaction Pdb._cmdloop interaction _cmdloop", "pdb prompt", "debugger", "person",
          "pdb stopped the program and waits for a command on its terminal"),
    _site(("bdb.py",), "Bdb.trace_dispatch Bdb.dispatch_line trace_dispatch dispatch_line", "pdb prompt",
          "debugger", "person", "a breakpoint stopped the program; the debugger waits for a command"),
    _site(("cmd.py",), "Cmd.cmdloop cmdloop", "debugger prompt", "debugger", "person",
          "a command loop waits for a command on its terminal"),
    _site(("code.py",), "InteractiveConsole.interact interact InteractiveConsole.raw_input raw_input",
          "interactive console", "debugger", "person", "an interactive console waits for input"),
    _site(("ipdb/__main__.py", "IPython/core/debugger.py", "IPython/terminal/debugger.py"),
          "set_trace Pdb.interaction interaction cmdloop", "ipdb prompt", "debugger", "person",
          "ipdb stopped the program and waits for a command on its terminal"),
    _site(("pudb/__init__.py", "pudb/debugger.py"), "set_trace Debugger.interaction interaction",
          "pudb prompt", "debugger", "person", "pudb stopped the program and waits for a key on its terminal"),
    _site(("debugpy/_vendored/pydevd/pydevd.py", "pydevd.py"), "PyDB._do_wait_suspend _do_wait_suspend "
          "do_wait_suspend", "debugpy pause", "debugger", "person",
          "a remote debugger (debugpy, an IDE) paused the thread and waits for its client"),
    # --- torch.distributed: stores (collectives and p2p are frames.py's table)
    _site(("torch/distributed/distributed_c10d.py",), "_store_based_barrier", "store-based barrier", "store_key",
          "key_setter", "waits in the store until every rank has added itself to the barrier's key"),
    _site(("torch/distributed/elastic/rendezvous/c10d_rendezvous_backend.py",
           "torch/distributed/elastic/rendezvous/dynamic_rendezvous.py"),
          "DynamicRendezvousHandler.next_rendezvous next_rendezvous _RendezvousJoinOp.__call__ "
          "_BackendRendezvousStateHolder.sync sync", "elastic rendezvous", "store_key", "key_setter",
          "waits in the rendezvous until the expected nodes have joined"),
    _site(("torch/distributed/rendezvous.py",), "_create_c10d_store _tcp_rendezvous_handler "
          "_env_rendezvous_handler", "rendezvous", "store_key", "key_setter",
          "waits to connect to the job's store (MASTER_ADDR:MASTER_PORT) or for the ranks to join it"),
    _site(("torch/distributed/elastic/utils/store.py",), "get_all synchronize barrier _barrier_nonblocking",
          "elastic store barrier", "store_key", "key_setter",
          "waits in the store until every rank has written its key"),
    # --- autograd: DDP's gradient all_reduce runs inside the C++ engine, with no torch.distributed frame
    _site(("torch/autograd/graph.py",), "_engine_run_backward", "autograd backward", "native", "unknown",
          "runs the backward pass in autograd's C++ engine; under DDP, its gradient all_reduce waits there for every "
          "rank"),
    # --- torch.cuda and the DataLoader
    _site(("torch/cuda/__init__.py",), "synchronize", "torch.cuda.synchronize", "device", "device",
          "waits until every kernel queued on the GPU has finished"),
    _site(("torch/cuda/streams.py",), "Stream.synchronize Event.synchronize synchronize Event.wait",
          "CUDA stream synchronize", "device", "device", "waits until the GPU work queued on the stream is done"),
    _site(("torch/utils/data/dataloader.py",), "_MultiProcessingDataLoaderIter._next_data "
          "_MultiProcessingDataLoaderIter._get_data _MultiProcessingDataLoaderIter._try_get_data _next_data "
          "_get_data _try_get_data", "DataLoader next batch", "process_queue", "worker",
          "waits for the next batch from the DataLoader's worker processes (or its pin-memory thread)",
          timeout="timeout"),
    _site(("torch/utils/data/_utils/pin_memory.py",), "_pin_memory_loop", "DataLoader pin-memory thread",
          "process_queue", "worker", "waits for batches from the DataLoader's worker processes", generic=True),
    # --- lock files (these poll: a sleep in a loop)
    # filelock 3.x kept its lock in _api.py; later versions in _core/ (the polling loop in LockAcquisition)
    _site(("filelock/_api.py", "filelock/_unix.py", "filelock/_core/_lock.py", "filelock/_core/_acquire.py"),
          "BaseFileLock.acquire acquire LockAcquisition._poll_until_acquired _poll_until_acquired "
          "LockAcquisition._acquire_level _acquire_level", "filelock acquire",
          "file_lock", "lock_holder", "polls for a lock file that another process holds", timeout="timeout"),
    _site(("portalocker/portalocker.py", "portalocker/utils.py"), "lock Lock.acquire acquire", "portalocker lock",
          "file_lock", "lock_holder", "waits for a file lock that another process holds", timeout="timeout"),
    # --- imports: a second thread importing a module another thread is still importing waits for its module lock
    _site(("<frozen importlib._bootstrap>", "importlib/_bootstrap.py"), "_ModuleLock.acquire acquire", "import lock",
          "lock", "importer", "waits until the thread importing the same module has finished its import"),
    # --- signals
    _site(("signal.py",), "sigwait sigwaitinfo sigtimedwait", "signal wait", "signal", "unknown",
          "waits for a signal to arrive"),
)

# C functions called from a Python line (no frame of their own). `functions` are the names called; `module`, when
# set, the module called through (`time.sleep`); `receiver` a pattern for the receiver's repr in the locals.
CALL_SITES: Tuple[Site, ...] = (
    _site((), "recv recv_into recvfrom recvfrom_into recvmsg", "socket.recv", "socket", "peer",
          "waits for bytes from the socket's peer", receiver=r"socket|SSLSocket",
          syscalls=("recvfrom", "recvmsg", "read", "poll", "ppoll", "select", "pselect6")),
    _site((), "send sendall sendto sendmsg", "socket.send", "socket", "peer",
          "the socket's send buffer is full: waits for the peer to read", receiver=r"socket|SSLSocket",
          syscalls=("sendto", "sendmsg", "write", "poll", "ppoll")),
    _site((), "accept", "socket.accept", "socket", "peer", "waits for a client to connect",
          receiver=r"socket", syscalls=("accept", "accept4", "poll", "ppoll")),
    _site((), "connect connect_ex create_connection", "socket.connect", "socket", "peer",
          "waits for the server to accept the connection", syscalls=("connect", "poll", "ppoll")),
    _site((), "sleep", "time.sleep", "timer", "time", "sleeps for the given time", module="time",
          syscalls=("clock_nanosleep", "nanosleep", "select", "restart_syscall")),
    _site((), "input", "input()", "terminal", "writer",
          "reads a line from standard input: waits until someone types one or writes it", module="",
          syscalls=("read", "select", "pselect6", "poll")),
    # `.acquire()` with no Python frame above it asleep in futex is a C lock's or semaphore's acquire
    # (threading.Lock/RLock, multiprocessing's SemLock), whatever the job called it (`self._turn`, `slot`)
    _site((), "acquire", "Lock.acquire", "lock", "holder", "waits for a lock another thread holds",
          receiver=r"lock|Lock|Semaphore|RLock|Condition", syscalls=("futex",), timeout="timeout",
          kernel_confirms=True),
    _site((), "flock", "fcntl.flock", "file_lock", "lock_holder",
          "waits for a lock on a file that another process holds", module="fcntl", syscalls=("flock",)),
    # lockf() is fcntl(F_SETLKW) underneath: a POSIX record lock, held per process (and dropped when it closes any
    # fd of the file)
    _site((), "lockf", "fcntl.lockf", "file_lock", "lock_holder",
          "waits for a POSIX record lock on a file that another process holds", module="fcntl", syscalls=("fcntl",)),
    _site((), "wait get", "store.wait", "store_key", "key_setter",
          "waits in the job's store (TCPStore) until another rank sets the key", receiver=r"Store\b|Store at",
          syscalls=("recvfrom", "recvmsg", "read", "poll", "ppoll", "futex")),
    _site((), "waitpid wait wait3 wait4 waitid", "os.waitpid", "child", "children",
          "waits until a child process exits", module="os", syscalls=("wait4", "waitid")),
    _site((), "read readline readlines readinto", "read", "pipe", "writer",
          "reads from a file descriptor: waits until its writer writes (a pipe, a FIFO, a terminal)",
          syscalls=("read", "readv", "pread64", "select", "poll")),
    _site((), "write", "write", "pipe", "reader",
          "writes to a file descriptor whose buffer is full: waits until its reader reads",
          syscalls=("write", "writev")),
    _site((), "select poll epoll", "select", "socket", "peer", "waits until a file descriptor is ready",
          module="select", syscalls=("select", "pselect6", "poll", "ppoll", "epoll_wait", "epoll_pwait")),
    _site((), "pause", "signal.pause", "signal", "unknown", "waits for any signal", module="signal",
          syscalls=("pause",)),
    _site((), "wait", "Work.wait", "collective", "ranks",
          "waits until an asynchronous collective or send/recv completes on every rank it involves",
          receiver=r"Work\b|Work at", syscalls=("futex",)),
    _site((), "synchronize item cpu tolist numpy", "CUDA synchronisation", "device", "device",
          "waits until the GPU has finished the work queued before it", receiver=r"cuda|Stream|Event",
          syscalls=("futex", "ioctl", "poll")),
)

# C/C++ functions seen with --native (py-spy's native frames, gdb): a symbol fragment -> what the call waits on.
# Tried innermost first, before the line's text, so a native frame that names the wait outranks a guess.
NativeSite = Tuple[str, Resource, Release, str, str]
NATIVE_SITES: Tuple[NativeSite, ...] = (
    ("TCPStore::doWait", "store_key", "key_setter", "store.wait", "waits in the job's store until another rank sets "
     "the key"),
    ("TCPStore::doGet", "store_key", "key_setter", "store.get", "waits in the job's store until the key is set"),
    ("TCPStore::wait", "store_key", "key_setter", "store.wait", "waits in the job's store until another rank sets "
     "the key"),
    ("cudaStreamSynchronize", "device", "device", "cudaStreamSynchronize", "waits until the GPU work queued on the "
     "stream is done"),
    ("cudaDeviceSynchronize", "device", "device", "cudaDeviceSynchronize", "waits until every kernel queued on the "
     "GPU is done"),
    ("cudaEventSynchronize", "device", "device", "cudaEventSynchronize", "waits until the GPU reaches the event"),
    ("cuStreamSynchronize", "device", "device", "cuStreamSynchronize", "waits until the GPU work queued on the "
     "stream is done"),
    ("ncclCommInitRank", "collective", "ranks", "ncclCommInitRank", "waits until every rank of the communicator "
     "has joined its initialisation"),
    ("ncclGroupEnd", "collective", "ranks", "ncclGroupEnd", "waits for the grouped NCCL operations to be launched on "
     "every rank"),
    ("c10d::Work::wait", "collective", "ranks", "Work.wait", "waits until an asynchronous collective completes on every "
     "rank it involves"),
    ("ProcessGroupGloo::", "collective", "ranks", "gloo collective", "waits in a gloo collective for the other ranks"),
    ("std::thread::join", "thread", "joined", "std::thread::join", "waits until a C++ thread ends"),
    ("pthread_join", "thread", "joined", "pthread_join", "waits until a thread ends"),
)


def native_site(function: str) -> Optional[NativeSite]:
    """The NATIVE_SITES entry a native frame's symbol contains."""
    return next((entry for entry in NATIVE_SITES if entry[0] in function), None)


# What the kernel alone says (the system call, the kernel function asleep in): used when no site above names the
# call. (syscalls, wchan fragments, resource, release, operation, reason); the first match wins.
KernelSite = Tuple[Tuple[str, ...], Tuple[str, ...], Resource, Release, str, str]
KERNEL_SITES: Tuple[KernelSite, ...] = (
    ((), ("__refrigerator", "do_freezer_trap"), "unknown", "kernel", "frozen",
     "the cgroup freezer holds the process (the kernel's freezer wait): it does not run until its cgroup is thawed"),
    # cgroup v2 freezes a task in do_freezer_trap(), inlined into signal delivery: asleep in get_signal itself
    ((), ("=get_signal",), "unknown", "kernel", "frozen",
     "asleep inside signal delivery, where the cgroup v2 freezer traps a frozen task: it does not run until its "
     "cgroup is thawed"),
    ((), ("do_signal_stop",), "unknown", "kernel", "stopped", "stopped by a signal (SIGSTOP, job control)"),
    ((), ("ptrace_stop",), "unknown", "kernel", "stopped by a tracer", "stopped by its tracer"),
    (("wait4", "waitid"), ("do_wait",), "child", "children", "wait for a child", "waits until a child process exits"),
    (("flock", "fcntl"), ("flock", "locks_lock", "fcntl_setlk", "posix_lock"), "file_lock", "lock_holder",
     "file lock", "waits for a lock on a file that another process holds"),
    (("clock_nanosleep", "nanosleep"), ("nanosleep", "hrtimer"), "timer", "time", "sleep",
     "sleeps for a given time"),
    ((), ("pipe_read", "pipe_wait_readable"), "pipe", "writer", "pipe read", "waits for data on a pipe"),
    ((), ("pipe_write", "pipe_wait_writable", "anon_pipe_write"), "pipe", "reader", "pipe write",
     "the pipe is full: waits until its reader reads"),
    ((), ("n_tty_read", "tty_read"), "terminal", "writer", "terminal read", "waits for input on a terminal"),
    (("recvfrom", "recvmsg", "recvmmsg"), (), "socket", "peer", "socket recv", "waits for bytes from a socket's peer"),
    (("accept", "accept4"), (), "socket", "peer", "socket accept", "waits for a client to connect"),
    (("connect",), (), "socket", "peer", "socket connect", "waits for the server to accept the connection"),
    (("sendto", "sendmsg"), (), "socket", "peer", "socket send", "the socket's buffer is full"),
    ((), ("sk_wait_data", "inet_csk_accept", "unix_stream_read", "sock_alloc_send", "wait_for_tcp_memory",
          "inet_wait_for_connect", "unix_wait_for_peer"), "socket", "peer", "socket wait", "waits on a socket"),
    (("pause",), (), "signal", "unknown", "pause", "waits for any signal"),
    (("rt_sigsuspend", "rt_sigtimedwait"), (), "signal", "unknown", "signal wait", "waits for a signal"),
    ((), ("fuse_", "nfs", "rpc_wait", "io_schedule", "folio_wait", "wait_on_page", "blk_mq", "jbd2", "xfs_",
          "ext4_", "lustre", "ll_", "gpfs"), "file", "kernel", "file system call",
     "inside a file system or block I/O call that has not returned"),
    (("futex",), ("futex",), "native", "unknown", "futex wait",
     "waits on a futex: a lock or condition of C code (or of Python's, below a Python frame)"),
    (("epoll_wait", "epoll_pwait", "epoll_pwait2", "poll", "ppoll", "select", "pselect6"), (), "socket", "peer",
     "wait for file descriptors", "waits until one of its file descriptors is ready"),
    (("read", "readv", "pread64"), (), "pipe", "writer", "read", "waits for data from a file descriptor"),
    (("write", "writev", "pwrite64"), (), "pipe", "reader", "write", "waits to write to a file descriptor"),
)

_SEP = re.compile(r"[\\]")


def norm(filename: str) -> str:
    return _SEP.sub("/", filename)


def _names(function: str) -> Tuple[str, str]:
    """(qualified, bare): `Future.result` -> ("Future.result", "result"); `_Foo.<locals>.bar` -> bare `bar`."""
    return function, function.rsplit(".", 1)[-1]


@lru_cache(maxsize=8192)  # the same few hundred frames recur on every path
def frame_site(function: str, filename: str) -> Optional[Site]:
    """The FRAME_SITES entry for a Python frame, or None: a site naming the qualified function first
    (`Queue.get`), else one naming its bare name (`get`: py-spy before 0.4, module-level functions)."""
    name = norm(filename)
    qual, bare = _names(function)
    by_bare: Optional[Site] = None
    for site in FRAME_SITES:
        if not name.endswith(site.files):
            continue
        if qual in site.functions:
            return site
        if by_bare is None and bare in site.functions:
            by_bare = site
    return by_bare


def _chan(wchan: str, fragment: str) -> bool:
    """A wait channel matches a fragment that it starts with ("=name": that name exactly); a kernel function's
    name says its subsystem by its prefix (fuse_, nfs_, pipe_), so a fragment inside another word never counts
    (futex_do_wait is not do_wait)."""
    if fragment.startswith("="):
        return wchan == fragment[1:]
    return wchan.startswith(fragment) or wchan.startswith("__" + fragment)


def kernel_site(syscall: str, wchan: str) -> Optional[KernelSite]:
    """The KERNEL_SITES entry for a thread asleep in `syscall` with the kernel in `wchan`: the first whose system
    calls include it or whose kernel functions it is in (the table is ordered: what holds the process first,
    then the specific waits, then the generic ones)."""
    for entry in KERNEL_SITES:
        syscalls, chans = entry[0], entry[1]
        if (syscall and syscall in syscalls) or (wchan and any(_chan(wchan, c) for c in chans)):
            return entry
    return None
