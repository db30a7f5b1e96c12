"""Ranks of one job that joined another store. Their environment as started names the job's store and the job's
other ranks are connected there; these hold a connection to another address while they still join their group:
something in the process changed MASTER_ADDR/MASTER_PORT (an env file, a config), and a store left by an earlier
run answers there. Only a snapshot of several jobs shows who listens there; an address of another job's node is
never "outside the hosts list"."""

from __future__ import annotations

import dataclasses
from typing import Tuple

from analysis_snapshots import frame, rank, snapshot, sock
from app.analysis import analyze
from app.model import Frame, RankSnapshot

TORCH = "/usr/lib/python3/dist-packages/torch"
JOINING = (frame(f"_new_process_group_helper ({TORCH}/distributed/distributed_c10d.py:2169)"),
           frame(f"init_process_group ({TORCH}/distributed/distributed_c10d.py:1899)"),
           frame("setup (/srv/ml/run.py:40)"), frame("<module> (/srv/ml/run.py:90)"))
STORE_UP = (frame(f"_create_c10d_store ({TORCH}/distributed/rendezvous.py:199)"),
            frame(f"_env_rendezvous_handler ({TORCH}/distributed/rendezvous.py:280)"),
            frame(f"init_process_group ({TORCH}/distributed/distributed_c10d.py:1880)"),
            frame("setup (/srv/ml/run.py:40)"), frame("<module> (/srv/ml/run.py:90)"))


def member(n: int, node: str, ip: str, store: str, frames: Tuple[Frame, ...] = JOINING, pid: int = 0,
           job: str = "10.9.0.1:24000", port: int = 24000) -> RankSnapshot:
    r = rank(n, node, frames, world=8, pid=pid or 500 + n)
    return dataclasses.replace(r, job=job, master_addr=job.rsplit(":", 1)[0], master_port=port,
                               sockets=(sock(f"{ip}:{41000 + n}", store), sock(f"{ip}:{43000 + n}", "0.0.0.0:0",
                                                                                state="LISTEN")))


def test_ranks_in_another_jobs_store_are_named_with_who_serves_it() -> None:
    ips = {0: "10.9.0.1", 1: "10.9.0.1", 2: "10.9.0.2", 3: "10.9.0.2", 4: "10.9.0.3", 5: "10.9.0.3",
           6: "10.9.0.4", 7: "10.9.0.4"}
    ranks = [member(n, f"gpu{n // 2 + 1}", ips[n], "10.9.0.4:27777" if n in (2, 3) else "10.9.0.1:24000")
             for n in range(8)]
    # an earlier run's rank 0 on gpu4, still serving its store on 27777 and waiting for its ranks there
    old = dataclasses.replace(member(0, "gpu4", "10.9.0.4", "10.9.0.4:27777", STORE_UP, pid=77,
                                     job="gpu4:27777", port=27777),
                              sockets=(sock("[::]:27777", "[::]:0", state="LISTEN"),
                                       sock("10.9.0.4:27777", "10.9.0.2:41002"),
                                       sock("10.9.0.4:27777", "10.9.0.2:41003")))
    text = analyze(snapshot([*ranks, old])).verdict
    assert "ranks 2-3 on gpu2 joined the store at 10.9.0.4:27777, where pid 77 on gpu4 (rank 0 of job gpu4:27777) " \
        "listens, not their job's at 10.9.0.1:24000 where the other 6 ranks are" in text, text
    assert "Next: find what sets another MASTER_ADDR/MASTER_PORT in ranks 2-3's processes" in text, text
    findings = analyze(snapshot([*ranks, old])).findings
    assert not any("hosts list leaves out" in f.title for f in findings), [f.title for f in findings]


def test_one_job_whose_ranks_all_use_its_store_is_not_this_class() -> None:
    ranks = [member(n, f"gpu{n // 2 + 1}", f"10.9.0.{n // 2 + 1}", "10.9.0.1:24000") for n in range(8)]
    other = member(0, "gpu4", "10.9.0.4", "10.9.0.4:27777", STORE_UP, pid=77, job="gpu4:27777", port=27777)
    assert "joined the store" not in analyze(snapshot([*ranks, other])).verdict
