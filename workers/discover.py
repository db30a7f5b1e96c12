"""Finding the ranks of a distributed job on this node by environment and parentage, never by name patterns.

A rank is a Python process whose environment carries a rank variable (RANK, LOCAL_RANK, OMPI_COMM_WORLD_RANK,
PMI_RANK, SLURM_PROCID), or, without one, a multiprocessing spawn child with torch loaded that no rank started
(torch.multiprocessing.spawn, PyTorch's DDP tutorial: the rank is the spawn target's argument, read from its
locals on the login side, app/parse.py). Each rank says how it was found (`found_by`) and where its number comes
from (`rank_evidence`). Helpers that inherit a rank's environment or are its spawn children (data-loader workers,
compile workers) are listed as that rank's children, and a launcher that itself carries SLURM_PROCID (torchrun
under srun) is not a rank. When nothing is found, python processes with torch loaded are listed in the notes as
candidates for --pid. The worker's own process tree (its shell, its tools) is never considered.

The rest of each job is listed too, never as ranks (`Scan.processes`): the launchers above the ranks
(torchrun's agent, deepspeed, accelerate, srun, mpirun, the python that called mp.spawn) and each rank's child
processes (data-loader workers, compile workers, subprocesses); a launcher with no rank below it yet (torchrun
waiting for a rendezvous) is listed on its own, so a job that has not started its ranks is still a job.
"""

from __future__ import annotations

import os
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: see workers/__init__.py
    from typing import Any, Callable, Dict, Iterable, List, Optional, Pattern, Sequence, Set, Tuple

from workers import procinfo
from workers.procinfo import Gone, Proc
from workers.patterns import MATCH_BUDGET
from workers.protocol import MATCH_LIMIT
from workers.redact import redact_argv, redact_env_value

RANK_VARS = ("RANK", "LOCAL_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID")
ENV_ALLOW = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
             "MASTER_PORT", "CUDA_VISIBLE_DEVICES", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID",
             "SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_JOB_NODELIST", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "PMI_RANK",
             "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_FR_BUFFER_SIZE", "TORCH_DISTRIBUTED_DEBUG",
             # where a rank's Flight Recorder record can be read (workers/collect/flight.py)
             "TORCH_WORKER_SERVER_SOCKET", "TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
             # what ends a hung NCCL job and when (hangscope watch keeps its stall limit well below it:
             # app/watch/timeouts.py)
             "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", "TORCH_NCCL_ENABLE_MONITORING", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
             "TORCH_NCCL_BLOCKING_WAIT", "TORCH_NCCL_DUMP_ON_TIMEOUT", "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC")
ENV_ALLOW_PREFIXES = ("TORCHELASTIC_", "NCCL_")

# Launchers recognised in an ancestor's command line: (argv[0] basename or script basename, -m module).
_LAUNCHER_SCRIPTS = {"torchrun": "torchrun", "deepspeed": "deepspeed", "accelerate": "accelerate",
                     "srun": "srun", "slurmstepd": "srun", "mpirun": "mpirun", "mpiexec": "mpirun",
                     "orterun": "mpirun", "prterun": "mpirun", "orted": "mpirun", "prted": "mpirun",
                     "hydra_pmi_proxy": "mpirun", "mpiexec.hydra": "mpirun"}
_LAUNCHER_MODULES = {"torch.distributed.run": "torchrun", "torch.distributed.launch": "torchrun",
                     "deepspeed.launcher.launch": "deepspeed", "deepspeed.launcher.runner": "deepspeed",
                     "accelerate.commands.launch": "accelerate", "accelerate.commands.accelerate_cli":
                     "accelerate", "lightning.fabric.cli": "lightning", "lightning_fabric.cli": "lightning",
                     "lightning.pytorch.cli": "lightning"}


# Launchers that make a job by themselves, before any rank exists (srun and slurmstepd only lead to ranks).
STANDALONE_LAUNCHERS = ("torchrun", "deepspeed", "accelerate", "mpirun")
MAX_PROCESSES = 256  # launchers and children listed per node
MAX_CHILDREN = 32  # children listed per rank


def child_kind(p: Proc, rank: Proc) -> str:
    """What a rank's child is, from its command line (the login side refines it from its stack once dumped:
    torch's DataLoader workers are forked copies of the rank, or spawn children)."""
    text = " ".join(p.cmdline[:4])
    if "compile_worker" in text or "_inductor" in text:
        return "compile worker"
    if is_python(p) and (is_spawn_child(p) or p.cmdline == rank.cmdline):
        return "multiprocessing child"
    return "subprocess"


def cmdline_rank(argv: List[str]) -> Optional[Tuple[str, int]]:
    """A rank the process was given on its command line (`--rank 3`, `--rank=3`, `--global-rank 3`): (flag,
    number), or None. Read from the script's own arguments only (after the script or -m module)."""
    for i, a in enumerate(argv[1:64], 1):
        flag, eq, value = a.partition("=")
        if flag not in ("--rank", "--global-rank", "--global_rank"):
            continue
        value = value if eq else (argv[i + 1] if i + 1 < len(argv) else "")
        if value.isdigit() and len(value) < 10:
            return flag, int(value)
    return None


def is_python(p: Proc) -> bool:
    names = [os.path.basename(p.exe)] if p.exe else []
    if p.cmdline:
        names.append(os.path.basename(p.cmdline[0]))
    return any(n.startswith("python") for n in names)


def is_spawn_child(p: Proc) -> bool:
    """A child that multiprocessing's spawn (or forkserver) start method exec'd: `python -c 'from
    multiprocessing.spawn import spawn_main; spawn_main(...)' --multiprocessing-fork`, as torch.multiprocessing.
    spawn starts each rank."""
    argv = p.cmdline
    return "--multiprocessing-fork" in argv or any("from multiprocessing.spawn import spawn_main" in a
                                                   or "from multiprocessing.forkserver import main" in a
                                                   for a in argv[1:4])


def torch_loaded(pid: int) -> bool:
    """torch's C++ library is mapped: the process imported torch (reads /proc/PID/maps, bounded)."""
    try:
        with open("/proc/%d/maps" % pid, "rb") as f:
            data = f.read(8 << 20)
    except OSError:
        return False
    return b"/libtorch_cpu.so" in data or b"/libtorch_python.so" in data


def identity(env: Dict[str, str]) -> Tuple[Optional[str], ...]:
    return tuple(env.get(v) for v in RANK_VARS)


def is_rank_env(env: Optional[Dict[str, str]]) -> bool:
    return bool(env) and any(v in env for v in RANK_VARS)  # type: ignore[operator]


def launcher_name(p: Proc) -> Optional[str]:
    argv = p.cmdline
    for arg in argv[:2]:  # `torchrun ...` or `python3 /usr/bin/torchrun ...`
        name = _LAUNCHER_SCRIPTS.get(os.path.basename(arg))
        if name:
            return name
    for i, arg in enumerate(argv[:-1]):
        if arg == "-m":
            return _LAUNCHER_MODULES.get(argv[i + 1])
    exe = os.path.basename(p.exe) if p.exe else ""
    if exe.startswith("slurmstepd") or (p.cmdline and p.cmdline[0].startswith("slurmstepd:")):
        return "srun"  # Debian's /usr/sbin/slurmstepd-wlm; its command line reads `slurmstepd: [42.0]`
    return _LAUNCHER_SCRIPTS.get(exe) if exe else None


def _int(env: Dict[str, str], *names: str) -> Optional[int]:
    for n in names:
        try:
            return int(env[n])
        except (KeyError, ValueError):
            continue
    return None


def allowed_env(env: Dict[str, str]) -> List[Tuple[str, str]]:
    out = []
    for name in sorted(env):
        if name in ENV_ALLOW or name.startswith(ENV_ALLOW_PREFIXES):
            out.append((name, redact_env_value(name, env[name])))  # URL passwords in endpoints too
    return out


def own_tree(procs: Dict[int, Proc], me: int) -> Set[int]:
    """The worker, its ancestors (the shell that started it) and all its descendants (its tools)."""
    tree = {me}
    pid = me
    while pid in procs and procs[pid].ppid and pid not in (0, 1):
        pid = procs[pid].ppid
        tree.add(pid)
    kids: Dict[int, List[int]] = {}
    for p in procs.values():
        kids.setdefault(p.ppid, []).append(p.pid)
    stack = [me]
    while stack:
        for child in kids.get(stack.pop(), []):
            if child not in tree:
                tree.add(child)
                stack.append(child)
    return tree


class ProcCache:
    """What a process cannot change without exec (command line, exe, environment), kept between the scans
    of one worker so that a refresh reads one /proc/PID/stat per process instead of five to ten files.

    An entry is used while the pid shows the same start time (not reused) and the same process image (not
    exec'd since: procinfo.exec_key); what changes while a process lives (state, parent, CPU time, threads,
    RSS) is read again every scan. Environments read through sudo are kept like the others."""

    def __init__(self) -> None:
        self._procs: Dict[int, Proc] = {}
        self._described: Dict[Tuple[int, int], Dict[str, Any]] = {}

    def get(self, pid: int, stat: List[str]) -> Optional[Proc]:
        p = self._procs.get(pid)
        if p is None or p.exec_key != procinfo.exec_key(stat):
            return None
        fresh = p.copy()
        fresh.update(stat)
        return fresh

    def put(self, p: Proc) -> None:
        self._procs[p.pid] = p.copy()
        self._described.pop((p.pid, p.start_time), None)

    def keep_only(self, pids: Set[int]) -> None:
        """Forget processes that are gone: the cache never outgrows the node's process table."""
        for pid in [pid for pid in self._procs if pid not in pids]:
            del self._procs[pid]
        for key in [k for k in self._described if k[0] not in pids]:
            del self._described[key]

    def environ(self, pid: int, start_time: Optional[int]) -> Optional[Dict[str, str]]:
        """The environment discovery read for this process, if it is still the same one."""
        p = self._procs.get(pid)
        if p is None or start_time is None or p.start_time != start_time:
            return None
        return p.environ

    def described(self, p: Proc) -> Optional[Dict[str, Any]]:
        return self._described.get((p.pid, p.start_time))

    def remember(self, p: Proc, fields: Dict[str, Any]) -> None:
        self._described[(p.pid, p.start_time)] = fields


class Scan:
    """One pass over the node's processes."""

    def __init__(self, source: Any = None, me: Optional[int] = None,
                 read_denied: Optional[Callable[[List[int]], Dict[int, Dict[str, str]]]] = None,
                 cache: Optional[ProcCache] = None) -> None:
        # read_denied: environments this user may not read, read another way (sudo); pid -> environ
        # cache: kept by the caller across scans (the worker keeps one), or None to read everything
        self.source = source or procinfo.source()
        self.me = os.getpid() if me is None else me
        self.procs: Dict[int, Proc] = {}
        self.unreadable = 0
        self.notes: List[str] = []
        self._read_denied = read_denied
        self._cache = cache
        self._fresh: Set[int] = set()  # read in full by this scan, not taken from the cache
        self._own: Dict[int, Proc] = {}  # the worker's own tree: never ranks, but maybe a rank's ancestor
        self._spawned: Set[int] = set()  # ranks found as spawn children with torch loaded (no rank environment)
        self.processes: List[Dict[str, Any]] = []  # the jobs' other processes: launchers and ranks' children
        self._connected: Dict[int, str] = {}  # ranks found by their connections (no rank environment): why
        self._picked_by = "--pid"  # what picked the processes given by the user: --pid or --match

    def _load(self) -> None:
        cache = self._cache
        pids = self.source.pids()
        for pid in pids:
            try:
                stat = procinfo.stat_fields(pid)
                p = cache.get(pid, stat) if cache is not None else None
                if p is None:
                    p = self.source.read(pid, with_environ=False, stat=stat)
                    self._fresh.add(pid)
            except (Gone, OSError, IndexError, ValueError):
                continue  # exited mid-scan, or unreadable stat (hidepid): not ours to inspect
            self.procs[pid] = p
        skip = own_tree(self.procs, self.me)
        for pid in list(self.procs):
            if pid in skip:
                self._own[pid] = self.procs.pop(pid)
                continue
            p = self.procs[pid]
            if pid not in self._fresh or not is_python(p):
                continue
            try:
                full = self.source.read(pid, with_environ=True)
            except (Gone, OSError):
                del self.procs[pid]
                continue
            if full.start_time != p.start_time:  # pid reused between the two reads
                del self.procs[pid]
                continue
            self.procs[pid] = full
        denied = [pid for pid, p in self.procs.items() if p.environ_denied]
        if denied and self._read_denied is not None:
            for pid, env in self._read_denied(denied).items():
                if pid in self.procs:
                    self.procs[pid].environ, self.procs[pid].environ_denied = env, False
        self.unreadable = sum(1 for p in self.procs.values() if p.environ_denied)
        if cache is not None:
            for pid in self._fresh:
                if pid in self.procs:
                    cache.put(self.procs[pid])
            cache.keep_only(set(pids))

    def ranks(self, pids: Optional[Iterable[int]] = None, match: Optional[Pattern[str]] = None) -> List[Dict[str, Any]]:
        """Rank dicts (RankSnapshot identity fields); with pids, exactly those that exist, rank env or not; with
        match, the python processes whose command line matches, less those that are ancestors of another
        matching one (a launcher's command line names the script too)."""
        self._load()
        self._picked_by = "--pid"
        if match is not None and pids is None:
            pids, self._picked_by = self._matching(match), "--match"
        ranks = {pid for pid, p in self.procs.items() if is_python(p) and is_rank_env(p.environ)}
        self._spawned = self._spawn_ranks(ranks)
        ranks |= self._spawned
        if pids is None:
            self._connected = self._connected_ranks(ranks)
            ranks |= set(self._connected)
        helpers: Dict[int, List[int]] = {}
        for pid in sorted(ranks):
            owner = self._helper_of(pid, ranks)
            if owner is not None:
                helpers.setdefault(owner, []).append(pid)
        for kids in helpers.values():
            ranks.difference_update(kids)
        # A launcher started by srun carries SLURM_PROCID like its ranks: a rank child with the same value.
        for pid in list(ranks):
            env = self.procs[pid].environ or {}
            procid = env.get("SLURM_PROCID")
            if procid is not None and any(
                    self.procs[c].ppid == pid and (self.procs[c].environ or {}).get("SLURM_PROCID") == procid
                    for c in ranks if c != pid):
                ranks.discard(pid)
        if pids is not None:
            wanted = set(pids)
            ranks = {p for p in wanted if p in self.procs}
        elif not ranks:
            self.notes += self._candidates()
        spawned = len(self._spawned & ranks)  # with --pid, only those asked about: the rest are not this job's
        if spawned:
            self.notes.append("%d process%s started by multiprocessing spawn with torch loaded and no RANK in the "
                              "environment (torch.multiprocessing.spawn): taken as ranks; the rank number comes "
                              "from the job's store (read-only) or the spawn target's `rank` argument (--locals)"
                              % (spawned, "" if spawned == 1 else "es"))
        if os.geteuid() != 0 and proc_hides_pids():
            self.notes.append("/proc is mounted with hidepid: other users' processes are invisible here: connect "
                              "as their user or as root")
        if self.unreadable:
            self.notes.append("%d python processes of other users could not be inspected: run as their user "
                              "or with --sudo" % self.unreadable)
        out = [self._describe(pid, helpers.get(pid, [])) for pid in sorted(ranks)]
        self.processes = self._job_processes(out, standalone=pids is None)
        for r in out:  # every descendant, not only the helpers that share its identity
            r["children"] = sorted(set(r["children"]) | {p["pid"] for p in self.processes
                                                        if p["role"] == "child" and p["of"] == [r["pid"]]})
        return out

    def _job_processes(self, ranks: List[Dict[str, Any]], standalone: bool) -> List[Dict[str, Any]]:
        """The launchers above the ranks, each rank's descendants, and (standalone) launchers without ranks."""
        rank_pids = {r["pid"] for r in ranks}
        kids: Dict[int, List[int]] = {}
        for p in self.procs.values():
            kids.setdefault(p.ppid, []).append(p.pid)
        out: Dict[int, Dict[str, Any]] = {}
        for r in ranks:
            # launchers: every launcher among its ancestors (srun above torchrun), and its launcher process
            cur, chain = r["ppid"], []
            for _ in range(64):
                a = self.procs.get(cur) or self._peek(cur)
                if a is None or cur in (0, 1) or cur in rank_pids:
                    break
                name = launcher_name(a)
                if name or cur == r.get("launcher_pid"):
                    chain.append((a, name or r.get("launcher") or "python"))
                cur = a.ppid
            for a, name in chain:
                entry = out.get(a.pid)
                if entry is None:
                    entry = out[a.pid] = self._process(a, "launcher", name, [])
                entry["of"].append(r["pid"])
            # children: every descendant that is not itself a rank, breadth first, bounded
            todo, listed = list(kids.get(r["pid"], [])), 0
            while todo and listed < MAX_CHILDREN:
                pid = todo.pop(0)
                if pid in rank_pids or pid in out:
                    continue
                todo.extend(kids.get(pid, []))
                p = self.procs[pid]
                out[pid] = self._process(p, "child", child_kind(p, self.procs[r["pid"]]), [r["pid"]])
                listed += 1
        if standalone:
            for pid, p in sorted(self.procs.items()):
                if pid in out or pid in rank_pids or len(out) >= MAX_PROCESSES:
                    continue
                name = launcher_name(p)
                if name in STANDALONE_LAUNCHERS and not self._launches_a_launcher(pid, kids):
                    out[pid] = self._process(p, "launcher", name, [])
        return [out[pid] for pid in list(out)[:MAX_PROCESSES]]

    def _launches_a_launcher(self, pid: int, kids: Dict[int, List[int]]) -> bool:
        """`torchrun` exec'd by a shell wrapper, deepspeed's runner above its per-node launcher: list the lowest."""
        return any(launcher_name(self.procs[c]) in STANDALONE_LAUNCHERS for c in kids.get(pid, [])
                   if c in self.procs)

    def _process(self, p: Proc, role: str, kind: str, of: List[int]) -> Dict[str, Any]:
        return {"pid": p.pid, "start_time": p.start_time, "ppid": p.ppid, "role": role, "kind": kind, "of": of,
                "cmdline": redact_argv(p.cmdline), "exe": p.exe, "python": is_python(p), "state": p.state,
                "wchan": procinfo.wchan(p.pid), "num_threads": p.num_threads, "cpu_time": p.cpu_time,
                "env": allowed_env(p.environ or {}) if role == "launcher" else [],
                "nspid": procinfo.ns_id(p.pid)}

    def _spawn_ranks(self, ranks: Set[int]) -> Set[int]:
        """Ranks without a rank environment (torch.multiprocessing.spawn, PyTorch's DDP tutorial: the rank is
        an argument, MASTER_ADDR is set in os.environ after exec): spawn children with torch loaded that no
        rank started. A spawn child of such a rank (a data-loader worker) is its helper, found below."""
        out: Set[int] = set()
        for pid, p in self.procs.items():
            if pid in ranks or not is_python(p) or not is_spawn_child(p) or is_rank_env(p.environ):
                continue
            if self._has_rank_ancestor(p, ranks) or not torch_loaded(pid):
                continue
            out.add(pid)
        return out

    def _connected_ranks(self, ranks: Set[int]) -> Dict[int, str]:
        """Ranks without a rank environment that are not spawn children (plain multiprocessing, a script that
        passes its rank on the command line): python processes with torch loaded, started by no rank, that
        hold TCP connections to the job's store (a known rank's MASTER_ADDR:MASTER_PORT, or a port another
        such process listens on: the TCPStore) or to each other (gloo's pairs). pid -> the evidence."""
        cands = {}
        above = self._ancestors(ranks)  # what started ranks launched them (a launcher run in-process): never a rank
        for pid, p in self.procs.items():
            if pid in ranks or pid in above or not is_python(p) or is_rank_env(p.environ) or launcher_name(p):
                continue
            if self._has_rank_ancestor(p, ranks) or not torch_loaded(pid):
                continue
            cands[pid] = p
        if not cands:
            return {}
        from workers.collect import sockets

        stores = {"%s:%s" % (e.get("MASTER_ADDR"), e.get("MASTER_PORT")) for e in
                  (self.procs[r].environ or {} for r in ranks) if e.get("MASTER_ADDR") and e.get("MASTER_PORT")}
        tables: Dict[str, Dict[int, Dict[str, Any]]] = {}
        held: Dict[int, List[Dict[str, Any]]] = {}
        for pid in cands:
            netns = procinfo.namespace(pid, "net") or str(pid)
            if netns not in tables:
                tables[netns] = sockets.tcp_table(pid)
            held[pid] = [tables[netns][i] for i in sockets.socket_inodes(pid) if i in tables[netns]]
        listening = {row["local"].rsplit(":", 1)[-1] for rows in held.values() for row in rows
                     if row["state"] == "LISTEN"}
        endpoints = {row["local"]: pid for pid, rows in held.items() for row in rows if row["state"] == "ESTABLISHED"}
        out: Dict[int, str] = {}
        for pid, rows in held.items():
            est = [row for row in rows if row["state"] == "ESTABLISHED"]
            to_store = sorted({row["peer"] for row in est if row["peer"] in stores
                               or row["peer"].rsplit(":", 1)[-1] in listening})
            peers = sorted({endpoints[row["peer"]] for row in est if endpoints.get(row["peer"], pid) != pid})
            if to_store:
                out[pid] = "holds a connection to the job's store (%s)" % ", ".join(to_store[:3])
            elif peers:
                out[pid] = "holds connections to other torch processes (pid %s)" % ", ".join(map(str, peers[:4]))
        # a found rank's forked children (DataLoader workers) hold its sockets too: they are its children
        for pid in [pid for pid in out if self._has_rank_ancestor(self.procs[pid], set(out))]:
            del out[pid]
        if out:
            self.notes.append("%d process%s with torch loaded and no RANK in the environment found by %s "
                              "connections to the job's store or to each other: taken as ranks; the rank number "
                              "comes from the job's store (read-only), the process's target's `rank` argument "
                              "(--locals) or its command line"
                              % (len(out), "" if len(out) == 1 else "es", "its" if len(out) == 1 else "their"))
        return out

    def _ancestors(self, pids: Set[int]) -> Set[int]:
        """Every process above these (their parents, up to init)."""
        out: Set[int] = set()
        for pid in pids:
            cur = self.procs[pid].ppid if pid in self.procs else 0
            for _ in range(64):
                if cur in out or cur not in self.procs or cur in (0, 1):
                    break
                out.add(cur)
                cur = self.procs[cur].ppid
        return out

    def _has_rank_ancestor(self, p: Proc, ranks: Set[int]) -> bool:
        cur = p.ppid
        for _ in range(64):
            if cur in ranks:
                return True
            a = self.procs.get(cur)
            if a is None:
                return False
            cur = a.ppid
        return False

    def _matching(self, match: Pattern[str]) -> List[int]:
        # (hangscope's own command line holds the pattern: never a match). The pattern passed
        # workers.patterns' rules, so each search is polynomial over at most MATCH_CMDLINE characters; the
        # budget bounds the whole scan too, and says which pattern ran out of it.
        found = set()
        deadline = time.monotonic() + MATCH_BUDGET
        python = [(pid, p) for pid, p in self.procs.items() if is_python(p)]
        for i, (pid, p) in enumerate(python):
            if time.monotonic() > deadline:
                self.notes.append("--match %s: stopped after %.0f s of matching, %d of %d python command lines "
                                  "searched: the pattern is too slow; simplify it"
                                  % (match.pattern[:MATCH_LIMIT], MATCH_BUDGET, i, len(python)))
                break
            if match.search(" ".join(p.cmdline)[:MATCH_CMDLINE]) is not None and not _asks_for(p.cmdline,
                                                                                                   match.pattern):
                found.add(pid)
        picked = sorted(found - self._ancestors(found))
        if not picked:
            self.notes.append("no python process here has a command line matching --match %s"
                              % match.pattern[:MATCH_LIMIT])
        return picked

    def _candidates(self) -> List[str]:
        """No rank found: python processes with torch loaded, each with why, and how to pick one."""
        found = []
        for pid, p in sorted(self.procs.items()):
            if is_python(p) and torch_loaded(pid):
                found.append("pid %d (%s)" % (pid, " ".join(redact_argv(p.cmdline))[:120]))
            if len(found) >= 8:
                break
        if not found:
            return []
        return ["no process with a rank environment (RANK, LOCAL_RANK, ...) nor a multiprocessing spawn child "
                "with torch loaded; python processes with torch loaded: %s: pick ranks with --match REGEX (their command line, "
                "on every node) or --pid PID"
                % "; ".join(found)]

    def _helper_of(self, pid: int, ranks: Set[int]) -> Optional[int]:
        """The rank this process helps: its nearest rank ancestor, when that one has the same identity."""
        me = identity(self.procs[pid].environ or {})
        cur = self.procs[pid].ppid
        owner = None
        for _ in range(64):
            p = self.procs.get(cur)
            if p is None:
                break
            if cur in ranks:
                if identity(p.environ or {}) != me:
                    break
                owner = cur  # keep climbing: a helper's helper belongs to the top rank process
            cur = p.ppid
        return owner

    def _launcher(self, p: Proc) -> Tuple[str, Optional[int]]:
        cur = p.ppid
        for _ in range(64):
            a = self.procs.get(cur)
            if a is None:
                a = self._peek(cur)
            if a is None:
                break
            name = launcher_name(a)
            if name:
                return name, cur
            cur = a.ppid
        parent = self.procs.get(p.ppid) or self._peek(p.ppid)
        if parent is not None and is_python(parent):
            return "python", p.ppid
        return "", None

    def _peek(self, pid: int) -> Optional[Proc]:
        if pid <= 0:
            return None
        if pid in self._own:  # pid 1 of a container, the sshd that also started the job's shell
            return self._own[pid]
        try:
            p = self.source.read(pid, with_environ=False)
        except (Gone, OSError):
            return None
        self.procs[pid] = p
        return p

    def _describe(self, pid: int, children: List[int]) -> Dict[str, Any]:
        p = self.procs[pid]
        # a process read afresh has no description left: ProcCache.put() dropped the old one
        fixed = self._cache.described(p) if self._cache is not None else None
        if fixed is None:
            fixed = self._fixed(p)
            if self._cache is not None:
                self._cache.remember(p, fixed)
        launcher, launcher_pid = self._launcher(p)
        if pid not in self._fresh:
            try:
                p.rss = procinfo.rss(pid)
            except (OSError, IndexError, ValueError):
                pass
        out = dict(fixed)
        out.update({
            "launcher": launcher, "launcher_pid": launcher_pid, "ppid": p.ppid,
            "state": p.state, "wchan": procinfo.wchan(pid), "num_threads": p.num_threads,
            "cpu_time": p.cpu_time, "rss": p.rss, "gpus": [], "children": sorted(children),
        })
        return out

    def _fixed(self, p: Proc) -> Dict[str, Any]:
        """What does not change while the process lives: identity, command line, environment, namespaces."""
        pid, env = p.pid, p.environ or {}
        rank_var = next((v for v in ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID")
                         if _int(env, v) is not None), None)
        spawned = pid in self._spawned
        arg_rank = None if rank_var else cmdline_rank(p.cmdline)
        return {
            "pid": pid, "start_time": p.start_time,
            # how the process was found, and where its rank number comes from ("" while unknown)
            "found_by": "rank environment" if is_rank_env(env) else (
                "multiprocessing spawn child with torch loaded" if spawned else (
                    "connections: " + self._connected[pid] if pid in self._connected else
                    self._picked_by)),
            "rank_evidence": "environment (%s)" % rank_var if rank_var else (
                "command line (%s)" % arg_rank[0] if arg_rank else ""),
            "rank": _int(env, "RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID") if rank_var else (
                arg_rank[1] if arg_rank else None),
            "local_rank": _int(env, "LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                               "SLURM_LOCALID"),
            "world_size": _int(env, "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"),
            "group_rank": _int(env, "GROUP_RANK"),
            "local_world_size": _int(env, "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"),
            "master_addr": env.get("MASTER_ADDR", ""),
            "master_port": _int(env, "MASTER_PORT"),
            "cmdline": redact_argv(p.cmdline), "exe": p.exe, "uid": p.uid, "user": procinfo.user_name(p.uid),
            "env": allowed_env(env), "nspid": procinfo.ns_id(pid), "in_container": in_container(pid, self.me),
        }


MATCH_CMDLINE = 4096  # characters of a command line a --match pattern is searched in


def _asks_for(cmdline: Sequence[str], pattern: str) -> bool:
    """Whether this command line passes `pattern` to --match (hangscope itself, on the login node)."""
    return ("--match=" + pattern) in cmdline or any(a == "--match" and b == pattern
                                                     for a, b in zip(cmdline, cmdline[1:]))


def proc_hides_pids() -> bool:
    try:
        with open("/proc/self/mounts") as f:
            mounts = f.read()
    except OSError:
        return False
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) > 3 and fields[1] == "/proc" and fields[2] == "proc":
            opts = dict(o.partition("=")[::2] for o in fields[3].split(","))
            return opts.get("hidepid", "0") not in ("0", "off")
    return False


def in_container(pid: int, me: int) -> bool:
    for kind in ("pid", "mnt"):
        theirs = procinfo.namespace(pid, kind)
        if theirs is not None and theirs != procinfo.namespace(me, kind):
            return True
    return False
