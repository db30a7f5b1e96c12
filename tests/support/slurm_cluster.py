"""A real SLURM on the namespace test cluster: munged, slurmctld in the first node, a slurmd in each other node.

Debian's packages (slurmctld, slurmd, slurm-client, munge), no systemd: every daemon runs in the foreground
inside its node (killed with the node). One munged on the host with a fresh key serves everyone through a
socket in the cluster's work dir (`AuthInfo=socket=`): the nodes' own /run is private. The login side (the
test process, the root netns) runs sbatch/scontrol/srun with SLURM_CONF pointing at the generated config.
SSH is not started: SLURM is the only way in, as on clusters that forbid SSH to compute nodes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Mapping, Optional

from cluster import Cluster, build_cluster
from waiting import wait_until

DAEMONS = ("/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/munged")
CLIENTS = ("sbatch", "scontrol", "squeue", "srun", "scancel")


def slurm_problem() -> Optional[str]:
    """Why no test SLURM can run here (packages missing), or None."""
    missing = [p for p in DAEMONS if not os.access(p, os.X_OK)] + [c for c in CLIENTS if shutil.which(c) is None]
    if missing:
        return f"SLURM test bed needs Debian's slurmctld, slurmd, slurm-client and munge: missing {', '.join(missing)}"
    return None


class SlurmCluster:
    """The namespace cluster plus SLURM; `env()` is the login side's environment for SLURM commands."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.dir = cluster.workdir / "slurm"
        self.conf = self.dir / "slurm.conf"
        self.controller = cluster.nodes[0]
        self.computes = cluster.nodes[1:]
        self._munged: Optional[subprocess.Popen[bytes]] = None

    @property
    def compute_names(self) -> list[str]:
        return [n.name for n in self.computes]

    def env(self, extra: Optional[Mapping[str, str]] = None) -> dict[str, str]:
        env = self.cluster.env({"SLURM_CONF": str(self.conf)})
        for key in [k for k in env if k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SQUEUE_"))]:
            if key != "SLURM_CONF":
                del env[key]  # a test run from inside a real allocation must not leak its job into ours
        env.update(extra or {})
        return env

    def run(self, *argv: str, timeout: float = 30, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(list(argv), env=self.env(), capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}\n"
                               f"{self.logs()}")
        return done

    def logs(self) -> str:
        parts = []
        for path in sorted(self.dir.glob("*.log")):
            text = path.read_text(errors="replace")[-1500:]
            parts.append(f"--- {path.name}\n{text}")
        return "\n".join(parts)

    def close(self) -> None:
        try:
            self.cluster.close()
        finally:
            if self._munged is not None:
                self._munged.kill()
                self._munged.wait(10)

    def __enter__(self) -> SlurmCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- bring-up ------------------------------------------------------------------------------------------

    def start(self, timeout: float = 60) -> None:
        self.dir.mkdir(mode=0o755)
        for sub in ("state", "spool"):
            (self.dir / sub).mkdir(mode=0o755)
        key = self.dir / "munge.key"
        key.write_bytes(os.urandom(128))
        key.chmod(0o400)
        socket = self.dir / "munge.socket"
        self._munged = subprocess.Popen(  # pdeathsig: a killed test run takes munged along (the nodes go too)
            ["setpriv", "--pdeathsig", "KILL", "--", "/usr/sbin/munged", "--foreground", "--force", f"--key-file={key}", f"--socket={socket}",
             f"--pid-file={self.dir / 'munged.pid'}", f"--seed-file={self.dir / 'munge.seed'}",
             f"--log-file={self.dir / 'munged.log'}", "--num-threads=2"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(lambda: socket.exists() or self._munged_died(), 10, "munged's socket")
        self.conf.write_text(self._config(socket))
        # hybrid cgroup hierarchies defeat slurmd's autodetection; nothing here is confined by cgroups anyway
        (self.dir / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nCgroupAutomount=no\n")
        logs = self.dir
        with open(logs / "slurmctld.out", "ab") as out:
            self.controller.spawn(["/usr/sbin/slurmctld", "-D", "-i", "-f", str(self.conf)],
                                  env={"SLURM_CONF": str(self.conf)}, stdout=out, stderr=subprocess.STDOUT)
        for node in self.computes:
            (self.dir / "spool" / node.name).mkdir(mode=0o755)
            with open(logs / f"slurmd-{node.name}.out", "ab") as out:
                node.spawn(["/usr/sbin/slurmd", "-D", "-N", node.name, "-f", str(self.conf)],
                           env={"SLURM_CONF": str(self.conf)}, stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_until(self._all_idle, timeout, "every slurmd registered and idle", interval=0.2)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}\n{self.logs()}") from None

    def _munged_died(self) -> bool:
        assert self._munged is not None
        if self._munged.poll() is not None:
            raise RuntimeError(f"munged exited ({self._munged.returncode}):\n{self.logs()}")
        return False

    def _all_idle(self) -> bool:
        done = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], env=self.env(), capture_output=True,
                              text=True, timeout=10, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            return False
        states = dict(line.split() for line in done.stdout.splitlines() if line.strip())
        return all(states.get(n) == "idle" for n in self.compute_names)

    def _config(self, socket: Path) -> str:
        d = self.dir
        nodes = "".join(f"NodeName={n.name} NodeAddr={n.ip} CPUs=2 State=UNKNOWN\n" for n in self.computes)
        return f"""\
# hangscope test SLURM (tests/support/slurm_cluster.py); no cgroups, no accounting, everything as root
ClusterName=hangscope
SlurmctldHost={self.controller.name}({self.controller.ip})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={socket}
CredType=cred/munge
StateSaveLocation={d / 'state'}
SlurmdSpoolDir={d / 'spool'}/%n
SlurmctldPidFile={d / 'slurmctld.pid'}
SlurmdPidFile={d / 'slurmd-%n.pid'}
SlurmctldLogFile={d / 'slurmctld.log'}
SlurmdLogFile={d / 'slurmd-%n.log'}
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
MpiDefault=none
ReturnToService=2
GresTypes=gpu
SlurmdParameters=config_overrides
SlurmdTimeout=60
MessageTimeout=20
{nodes}PartitionName=debug Nodes={','.join(self.compute_names)} Default=YES MaxTime=INFINITE State=UP
"""


def build_slurm(computes: int = 2) -> SlurmCluster:
    """A controller node plus `computes` slurmd nodes, no sshd; close() (or `with`) removes everything."""
    problem = slurm_problem()
    if problem:
        raise RuntimeError(problem)
    cluster = build_cluster(computes + 1, start_sshd=False)
    slurm = SlurmCluster(cluster)
    try:
        slurm.start()
    except BaseException:
        slurm.close()
        raise
    return slurm
