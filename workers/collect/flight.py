"""PyTorch's Flight Recorder, when a rank runs with it: its per-process-group collective sequence numbers.

Only for ranks whose environment enables the recorder (TORCH_FR_BUFFER_SIZE / TORCH_NCCL_TRACE_BUFFER_SIZE > 0).
With gloo nothing dumps it by itself, so the record comes from where the job made it reachable:
- the rank's worker server (torch.distributed.elastic.control_plane.worker_main() with
  TORCH_WORKER_SERVER_SOCKET): `POST /handler/fr_trace_json` on that unix socket (and `dump_nccl_trace_json`,
  NCCL's own recorder, where torch was built with CUDA: the two records merged), only after the rank is seen to
  listen on that path itself (one of its own fds), reached through /proc/PID/root (its mount namespace);
- a dump file, TORCH_FR_DUMP_TEMP_FILE / TORCH_NCCL_DEBUG_INFO_TEMP_FILE followed by the rank number: owned by the
  rank's user, written since the rank started, opened without following a link, JSON or a pickle of plain data
  (unpickled with every global refused: a file from the job never runs code here).
The record is trimmed on the node (group status, group names, the newest entries; no stack frames), and
collect() never raises: a failure is a note, the rank's dump goes on without it.
"""

from __future__ import annotations

import json
import os
import stat

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: see workers/__init__.py
    from typing import Any, Dict, List, Optional, Tuple

from workers import procinfo
from workers.collect.sockets import socket_inodes
from workers.redact import redact_text

ENABLE_VARS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
SOCKET_VAR = "TORCH_WORKER_SERVER_SOCKET"
FILE_VARS = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
HANDLER = "/handler/fr_trace_json"
# NCCL's collectives are in a recorder of their own (FlightRecorder<CUDAEvent>), served by the handler that CUDA
# builds of torch register beside it; CPU builds answer 404, and the record is fr_trace_json's alone
NCCL_HANDLER = "/handler/dump_nccl_trace_json"
TIMEOUT = 3.0  # seconds for the worker server to answer: its handler runs in the rank's own server thread
MAX_BYTES = 16 << 20  # a 2000-entry record with stack frames is a few MB
MAX_ENTRIES = 32  # the newest entries travel back; pg_status already holds every group's numbers
MAX_GROUPS = 256
ENTRY_FIELDS = ("record_id", "pg_id", "collective_seq_id", "p2p_seq_id", "op_id", "profiling_name", "state",
                "retired", "is_p2p", "time_created_ns")
_ACCEPTCON = 0x10000  # /proc/net/unix Flags: a listening socket
MAX_PROBED = 4  # listening unix sockets of one rank asked whether they are its worker server
PING_TIMEOUT = 1.0


class FlightError(Exception):
    """Why one source gave no record (a note for the user, never fatal)."""


def _plain_unpickler(data: bytes) -> Any:
    """An unpickler of plain data only (dict, list, str, numbers): any class or function reference is
    refused. pickle is imported here, by the few ranks that have a record, not by every worker start."""
    import io
    import pickle

    class RefusingUnpickler(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            raise pickle.UnpicklingError("refused global %s.%s" % (module, name))

    return RefusingUnpickler(io.BytesIO(data))


def enabled(env: Dict[str, str]) -> Dict[str, str]:
    """The variables that switch the recorder on, with their values (buffer sizes > 0)."""
    out = {}
    for name in ENABLE_VARS:
        try:
            if int(env.get(name, "0").strip() or "0") > 0:
                out[name] = env[name]
        except ValueError:
            continue
    return out


def collect(pid: int, timeout: float = TIMEOUT, env: Optional[Dict[str, str]] = None,
            held: str = "") -> Optional[Dict[str, Any]]:
    """The rank's record and where it came from; None when its environment does not enable the recorder
    (or cannot be read: then the login side, which saw the environment at discovery, says so). env: the
    environment discovery read, when the caller has it. held: what holds the process (stopped, frozen, ...):
    its worker server cannot answer then, and is not asked."""
    if env is None:
        try:
            env = procinfo.parse_environ(procinfo.read_file("/proc/%d/environ" % pid))
        except OSError:
            return None
    on = enabled(env)
    if not on:
        return None
    out: Dict[str, Any] = {"enabled": on, "source": "", "path": "", "record": None, "written_at": None,
                           "notes": []}
    try:
        _collect(pid, env, timeout, out, held)
    except Exception as exc:  # a bug here must not cost the rank its stacks
        out["notes"].append("flight recorder: %s: %s" % (type(exc).__name__, exc))
    return out


def _collect(pid: int, env: Dict[str, str], timeout: float, out: Dict[str, Any], held: str = "") -> None:
    path = env.get(SOCKET_VAR, "")
    if path and held:
        out["notes"].append("worker server %s not asked: the rank is %s and cannot answer" % (path, held))
    elif path:
        try:
            out["record"] = trim(_from_server(pid, path, timeout))
            out["source"], out["path"] = "worker_server", path
            return
        except FlightError as exc:
            out["notes"].append("worker server %s: %s" % (path, exc))
    else:
        # A job may set TORCH_WORKER_SERVER_SOCKET inside Python, before worker_main(): not in
        # /proc/PID/environ. The rank's own listening unix sockets are asked, the ones that answer the worker
        # server's handler protocol (`ping`) are asked for the record.
        for candidate in listening_unix_paths(pid)[:MAX_PROBED]:
            try:
                if not _answers_ping(pid, candidate, min(timeout, PING_TIMEOUT)):
                    continue
                out["record"] = trim(_from_server(pid, candidate, timeout))
                out["source"], out["path"] = "worker_server", candidate
                out["notes"].append("worker server found by its listening socket %s (%s is not in the rank's "
                                    "environment)" % (candidate, SOCKET_VAR))
                return
            except FlightError as exc:
                out["notes"].append("worker server %s: %s" % (candidate, exc))
    rank = env.get("RANK", "").strip()
    for var in FILE_VARS:
        prefix = env.get(var, "")
        if not prefix or not rank.isdigit():
            continue
        name = prefix + rank
        try:
            record, written = _from_file(pid, name)
        except FlightError as exc:
            out["notes"].append("dump file %s: %s" % (name, exc))
            continue
        out["record"], out["written_at"] = trim(record), written
        out["source"], out["path"] = "dump_file", name
        return


def listening_unix_paths(pid: int) -> List[str]:
    """The paths (as bound in the rank's namespace) of the unix stream sockets the rank itself listens on,
    except multiprocessing's own listeners (pymp-*: they authenticate, a request would only be refused)."""
    mine = set(socket_inodes(pid))
    if not mine:
        return []
    try:
        text = procinfo.read_file("/proc/%d/net/unix" % pid, 64 << 20).decode("utf-8", "replace")
    except OSError:
        return []
    found: List[str] = []
    for line in text.splitlines()[1:]:
        fields = line.split(None, 7)  # Num RefCount Protocol Flags Type St Inode Path
        if len(fields) != 8 or not fields[7].startswith("/") or "/pymp-" in fields[7]:
            continue
        try:
            if int(fields[6]) in mine and int(fields[3], 16) & _ACCEPTCON and int(fields[4], 16) == 1:
                if fields[7] not in found:
                    found.append(fields[7])
        except ValueError:
            continue
    return found


def _answers_ping(pid: int, path: str, timeout: float) -> bool:
    """Whether the socket speaks the worker server's handler protocol: `POST /handler/ping` answers 200."""
    try:
        status, _ = _request(pid, path, "/handler/ping", timeout, 4096)
    except FlightError:
        return False
    return status == 200


def listens_on(pid: int, path: str) -> bool:
    """Whether one of pid's own sockets listens on the unix socket `path` (as bound in its namespace)."""
    mine = set(socket_inodes(pid))
    try:
        text = procinfo.read_file("/proc/%d/net/unix" % pid, 64 << 20).decode("utf-8", "replace")
    except OSError:
        return False
    for line in text.splitlines()[1:]:
        fields = line.split(None, 7)  # Num RefCount Protocol Flags Type St Inode Path
        if len(fields) == 8 and fields[7] == path:
            try:
                if int(fields[6]) in mine and int(fields[3], 16) & _ACCEPTCON:
                    return True
            except ValueError:
                continue
    return False


def _in_root(pid: int, path: str) -> str:
    """`path` as the rank sees it: through its root (mount namespace) or, when relative, its cwd."""
    return ("/proc/%d/root%s" if path.startswith("/") else "/proc/%d/cwd/%s") % (pid, path)


def _unix_connection(sock: Any, timeout: float) -> Any:
    """An HTTP connection over an already connected unix socket."""
    import http.client  # see _from_server

    class UnixConnection(http.client.HTTPConnection):
        def connect(self) -> None:
            self.sock = sock

    return UnixConnection("localhost", timeout=timeout)


def _from_server(pid: int, path: str, timeout: float) -> Any:
    if not listens_on(pid, path):
        raise FlightError("the rank does not listen on it (another rank's socket, or not started)")
    status, body = _request(pid, path, HANDLER, timeout, MAX_BYTES + 1)
    if status != 200:
        raise FlightError("HTTP %d from %s (torch too old for fr_trace_json?)" % (status, HANDLER))
    record = _decode(body)
    try:
        status, body = _request(pid, path, NCCL_HANDLER, timeout, MAX_BYTES + 1)
        if status == 200:
            record = merge(record, _decode(body))
    except FlightError:
        pass  # no NCCL recorder: the CPU one's record stands
    return record


def merge(cpu: Any, nccl: Any) -> Any:
    """One record of the two recorders a rank keeps: every group's status and config, the entries of both in the
    order they were created (NCCL's status wins for a group both know)."""
    if not isinstance(nccl, dict):
        return cpu
    if not isinstance(cpu, dict):
        return nccl
    out = dict(cpu)
    for key in ("pg_status", "pg_config"):
        a, b = cpu.get(key), nccl.get(key)
        both = dict(a) if isinstance(a, dict) else {}
        both.update(b if isinstance(b, dict) else {})
        out[key] = both
    entries = [e for part in (cpu.get("entries"), nccl.get("entries")) if isinstance(part, list)
               for e in part if isinstance(e, dict)]
    out["entries"] = sorted(entries, key=_created)
    if not out.get("version"):
        out["version"] = nccl.get("version", "")
    return out


def _created(entry: Dict[str, Any]) -> Tuple[int, int]:
    t = entry.get("time_created_ns")
    return (t if isinstance(t, int) else 0, _record_id(entry))


def _request(pid: int, path: str, handler: str, timeout: float, limit: int) -> Tuple[int, bytes]:
    """(status, body up to `limit` bytes) of `POST handler` on the unix socket `path` in the rank's namespace."""
    # Imported here, not at the top: http.client pulls in email, ssl and urllib, ~0.1 s of every worker's
    # start (~0.4 s on a loaded node), and only ranks serving the Flight Recorder need it (socket too).
    import http.client
    import socket
    try:
        fd = os.open(_in_root(pid, path), os.O_PATH)
    except OSError as exc:
        raise FlightError("cannot reach it: %s" % (exc.strerror or exc))
    try:
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            raise FlightError("not a socket")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            # by the fd: /proc/PID/root/... can be longer than a socket address may be (108 bytes)
            sock.connect("/proc/self/fd/%d" % fd)
            conn = _unix_connection(sock, timeout)
            conn.request("POST", handler, body=b"", headers={"Connection": "close"})
            resp = conn.getresponse()
            body = resp.read(limit)
        except (OSError, http.client.HTTPException) as exc:
            raise FlightError("no answer within %.1f s: %s" % (timeout, exc) if isinstance(exc, socket.timeout)
                              else "request failed: %s" % exc)
        finally:
            sock.close()
    finally:
        os.close(fd)
    return resp.status, body


def _from_file(pid: int, name: str) -> Any:
    try:
        fd = os.open(_in_root(pid, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        raise FlightError("not written (gloo writes none by itself)")
    except OSError as exc:
        raise FlightError("cannot open: %s" % (exc.strerror or exc))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FlightError("not a regular file")
        try:
            owner = os.stat("/proc/%d" % pid).st_uid
        except OSError:
            raise FlightError("the rank exited")
        if st.st_uid != owner:
            raise FlightError("owned by uid %d, not by the rank's user (uid %d)" % (st.st_uid, owner))
        if st.st_mtime < _started_at(pid) - 1:
            raise FlightError("older than the rank: left by an earlier run")
        if st.st_size > MAX_BYTES:
            raise FlightError("%d bytes, more than the %d read" % (st.st_size, MAX_BYTES))
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(MAX_BYTES + 1)
    finally:
        os.close(fd)
    return _decode(data), st.st_mtime


def _started_at(pid: int) -> float:
    """The rank's start as epoch seconds (boot time + start ticks)."""
    btime = 0.0
    for line in procinfo.read_file("/proc/stat").decode("ascii", "replace").splitlines():
        if line.startswith("btime "):
            btime = float(line.split()[1])
    return btime + procinfo.start_time(pid) / os.sysconf("SC_CLK_TCK")


def _decode(data: bytes) -> Any:
    if len(data) > MAX_BYTES:
        raise FlightError("larger than %d bytes" % MAX_BYTES)
    if data[:1] in (b"{", b"["):
        try:
            return json.loads(data.decode("utf-8", "replace"))
        except ValueError as exc:
            raise FlightError("not valid JSON: %s" % exc)
    try:
        return _plain_unpickler(data).load()
    except Exception as exc:  # any malformed pickle: unpickling raises many kinds
        raise FlightError("neither JSON nor a plain-data pickle (%s)" % type(exc).__name__)


def _text(value: Any, limit: int = 200) -> str:
    return redact_text(value if isinstance(value, str) else str(value))[:limit]


def _record_id(entry: Dict[str, Any]) -> int:
    rid = entry.get("record_id")
    return rid if isinstance(rid, int) else -1


def _entry(e: Dict[str, Any]) -> Dict[str, Any]:
    """An entry's identifying fields, and its group's name (process_group: [name, desc]): the name is the same on
    every rank, where pg_id counts only the groups the rank is a member of."""
    out = {k: (_text(e[k]) if isinstance(e[k], str) else e[k]) for k in ENTRY_FIELDS
           if k in e and isinstance(e[k], (int, str, bool))}
    group = e.get("process_group")
    if isinstance(group, (list, tuple)) and group and isinstance(group[0], (str, int)):
        out["pg_name"] = _text(str(group[0]), 40)
        if len(group) > 1 and isinstance(group[1], str):
            out["pg_desc"] = _text(group[1], 60)  # the user's group_desc ("tp", "dp_shard"), else "undefined"
    return out


def trim(record: Any) -> Dict[str, Any]:
    """What travels back: every group's status and name, the newest entries' identifying fields."""
    if not isinstance(record, dict):
        raise FlightError("the record is not an object")
    status = record.get("pg_status")
    status = status if isinstance(status, dict) else {}
    config = record.get("pg_config")
    config = config if isinstance(config, dict) else {}
    raw = record.get("entries")
    raw = raw if isinstance(raw, list) else []
    entries = [e for e in raw if isinstance(e, dict)]
    newest: List[Dict[str, Any]] = entries[-MAX_ENTRIES:]
    have = {str(e.get("pg_id")) for e in newest}
    for e in reversed(entries[:-MAX_ENTRIES]):  # each group's newest entry, even when older than the rest
        pg = str(e.get("pg_id"))
        if pg not in have and len(have) < MAX_GROUPS:
            have.add(pg)
            newest.insert(0, e)
    keep = sorted(newest, key=_created)  # one recorder's ids follow its creation times; two recorders' do not
    return {
        "version": _text(record.get("version", ""), 40),
        "pg_status": {_text(k, 40): {_text(n, 60): v for n, v in s.items() if isinstance(v, (int, str))}
                      for k, s in list(status.items())[:MAX_GROUPS] if isinstance(s, dict)},
        "pg_config": {_text(k, 40): {n: _text(v) for n, v in c.items() if n in ("name", "desc", "ranks")}
                      for k, c in list(config.items())[:MAX_GROUPS] if isinstance(c, dict)},
        "entries": [_entry(e) for e in keep],
        "entries_total": len(entries),
    }
