"""Snapshots built in code for the report tests (realistic torch/gloo frames as FIELD-NOTES records them),
with secrets and hostile text planted where a real job can leak them; and tests that the builder is sound.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from app.model import CollectOptions, ErrorInfo, Frame, Local, LoopInfo, NodeInfo, NodeStatus, RankSnapshot, Snapshot, StraceResult, StraceThread, TcpSocket, ThreadStack, ToolInfo
from app.model.codec import snapshot_from_json, snapshot_to_json

C10D = "/opt/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
LOGGER = "/opt/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py"
TRAIN = "/home/alice/job/train.py"
LOADER = "/opt/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py"
THREADING = "/usr/lib/python3.11/threading.py"
STEP_LOOP = LoopInfo(kind="for", line=40, end_line=44, header="for step, batch in enumerate(loader):",
                     variables=("step", "batch"))
SOURCE = ((42, "        loss.backward()"), (43, "        dist.all_reduce(grad, group=groups[step % 2])"),
          (44, "        opt.step()"), (45, "    dist.barrier()"))

# Secrets a careless job leaks into its environment, command line and locals. Every exported file is checked
# for each of these values; none may survive.
SECRETS: Dict[str, str] = {
    "HF_TOKEN": "hf_QmZ8aXk2Lr9VtB7cYw3NdP6sJ1eF4gHuT0",
    "WANDB_API_KEY": "5d1c0a9e8f7b6a5c4d3e2f1a0b9c8d7e6f5a4b3c",
    "AWS_ACCESS_KEY_ID": "AKIAZX3KQ7RT5NV2LM4P",
    "AWS_SECRET_ACCESS_KEY": "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",
    "password_flag": "Tr0ub4dor-and-3",
    "url_password": "s3cr3t-url-pw",
    "github": "ghp_R4nd0mG1tHubT0k3nValue1234567890ab",
    "db_password_local": "correct-horse-battery",
    "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9.dBjftJeZ4CVPmB92K27uhbUJU1p1r_wW1gFWFOEjXk",
}
# Values that look a little like secrets but are not: they must survive redaction untouched.
HARMLESS: Dict[str, str] = {
    "MASTER_ADDR": "10.0.0.1",
    "NCCL_SOCKET_IFNAME": "eth0",
    "TOKENIZERS_PARALLELISM": "false",
    "lr": "0.1",
    "max_tokens": "4096",
    "keyframes": "3",
}
HOSTILE_NAME = "<script>alert(1)</script>"


def frame_train(line: int, step: Optional[int], *, secret_local: bool = False) -> Frame:
    locs: Tuple[Local, ...] = (Local("model", "<DistributedDataParallel at 0x7f3a2c1d0>", arg=True),)
    iteration: Tuple[Tuple[str, str], ...] = ()
    if step is not None:
        locs += (Local("step", str(step)), Local("batch", "<Tensor at 0x7f3a1b2c0>"))
        iteration = (("step", str(step)),)
    if secret_local:
        locs += (Local("db_password", repr(SECRETS["db_password_local"])),
                 Local("config", repr({"api_key": "sk-" + "A1b2C3d4" * 4, "lr": 0.1})),
                 Local("max_tokens", HARMLESS["max_tokens"]))
    return Frame("train", TRAIN, line, module="train", locals=locs, loops=(STEP_LOOP,) if step is not None else (),
                 iteration=iteration, source=SOURCE)


def main_stack(scenario: str, culprit: bool, step: int, rank: int) -> Tuple[Frame, ...]:
    outer = (Frame("main", TRAIN, 71, module="train"), Frame("<module>", TRAIN, 90, module="train"))
    if culprit and scenario == "barrier":
        return (Frame("barrier", C10D, 4159), Frame("wrapper", LOGGER, 81), frame_train(45, None)) + outer
    if culprit and scenario == "dataloader":
        return (Frame("_next_data", LOADER, 1329), Frame("__next__", LOADER, 631),
                frame_train(40, step, secret_local=True)) + outer
    if culprit and scenario == "hostile":
        return (Frame(HOSTILE_NAME, "/tmp/<img src=x onerror=alert(2)>.py", 3),
                frame_train(43, step, secret_local=True)) + outer
    ahead = 1 if culprit and scenario == "skip" else 0
    return (Frame("all_reduce", C10D, 2501), Frame("wrapper", LOGGER, 81),
            frame_train(43, step + ahead, secret_local=rank == 0)) + outer


def make_rank(node: str, node_index: int, local: int, per_node: int, *, scenario: str, culprit_rank: int,
              step: int = 5) -> RankSnapshot:
    rank = node_index * per_node + local
    world = per_node * 2
    pid = 4100 + rank * 7
    culprit = rank == culprit_rank
    main = ThreadStack(tid=pid, name=HOSTILE_NAME if culprit and scenario == "hostile" else "python3",
                       frames=main_stack(scenario, culprit, step, rank), state="S", wchan="futex_do_wait",
                       syscall="futex", is_main=True)
    helper = ThreadStack(tid=pid + 3, name="pt_autograd_0",
                         frames=(Frame("wait", THREADING, 320), Frame("run", THREADING, 982)), state="S")
    env = (("RANK", str(rank)), ("LOCAL_RANK", str(local)), ("WORLD_SIZE", str(world)),
           ("MASTER_ADDR", HARMLESS["MASTER_ADDR"]), ("MASTER_PORT", "29500"),
           ("NCCL_SOCKET_IFNAME", HARMLESS["NCCL_SOCKET_IFNAME"]),
           ("TOKENIZERS_PARALLELISM", HARMLESS["TOKENIZERS_PARALLELISM"]))
    if rank == 0:  # an allowlist slip on the node: the login-side redactor must still catch these
        env += tuple((k, SECRETS[k]) for k in ("HF_TOKEN", "WANDB_API_KEY", "AWS_ACCESS_KEY_ID",
                                                "AWS_SECRET_ACCESS_KEY"))
    cmdline = ("/opt/venv/bin/python3", "-u", "train.py", "--lr", HARMLESS["lr"], "--max-tokens",
               HARMLESS["max_tokens"], "--keyframes", HARMLESS["keyframes"],
               f"--password={SECRETS['password_flag']}", "--hub-token", SECRETS["github"],
               f"--data=https://alice:{SECRETS['url_password']}@data.example.com/shards")
    strace = gdb = None
    if culprit:
        strace = StraceResult(seconds=2.0, output=(
            f'futex(0x7f3a, FUTEX_WAIT_BITSET_PRIVATE, 0, NULL, FUTEX_BITSET_MATCH_ANY <unfinished ...>\n'
            f'write(2, "auth token {SECRETS["jwt"]}", 120) = 120\n\x1b]0;pwned\x07'),
            threads=(StraceThread(tid=pid, blocked_in="futex(FUTEX_WAIT_BITSET)", calls=1,
                                  top=(("futex", 1),)),))
        gdb = (f"Thread 1 (Thread 0x7f3a (LWP {pid})):\n"
               "#0  syscall () at ../sysdeps/unix/sysv/linux/x86_64/syscall.S:38\n"
               "#1  c10d::ProcessGroupGloo::AsyncWork::wait () from libtorch_cpu.so\n")
    sockets = (TcpSocket(local=f"10.0.0.{node_index + 1}:4{rank:04d}", peer="10.0.0.1:29500",
                         state="ESTABLISHED"),)
    return RankSnapshot(
        node=node, pid=pid, start_time=123456 + rank, rank=rank, local_rank=local, world_size=world,
        local_world_size=per_node, master_addr=HARMLESS["MASTER_ADDR"], master_port=29500, launcher="torchrun",
        launcher_pid=4000, ppid=4000, cmdline=cmdline, exe="/opt/venv/bin/python3.11", uid=1000, user="alice",
        state="S", wchan="futex_do_wait", num_threads=2, cpu_time=12.5 + rank, rss=315_000_000, env=env,
        threads=(main, helper), sockets=sockets, collected=True, strace=strace, gdb=gdb, elapsed=0.013)


def make_snapshot(scenario: str = "barrier", *, per_node: int = 4, culprit_rank: int = 5, failed_node: bool = False,
                  step: int = 5) -> Snapshot:
    """Two nodes x per_node ranks of one job; one culprit; optionally a third node that failed."""
    tools = (ToolInfo("py-spy", "/usr/local/bin/py-spy", "0.4.3"), ToolInfo("strace", "/usr/bin/strace", "6.1"))
    nodes: List[NodeStatus] = []
    ranks: List[RankSnapshot] = []
    for i, name in enumerate(("node01", "node02")):
        nodes.append(NodeStatus(name=name, address=f"10.0.0.{i + 1}", state="done", slots=per_node,
                                ranks_found=per_node, timings=(("connect", 0.21), ("collect", 0.05)),
                                info=NodeInfo(hostname=name, python="3.11.7", kernel="6.1.0", uid=1000, user="alice",
                                              ptrace_scope=0, cpus=2, tools=tools)))
        ranks += [make_rank(name, i, j, per_node, scenario=scenario, culprit_rank=culprit_rank, step=step)
                  for j in range(per_node)]
    if failed_node:
        nodes.append(NodeStatus(name="node03", address="10.0.0.3", state="failed", error=ErrorInfo(
            code="ssh_auth", message="node03: permission denied (publickey)", phase="login",
            hint="check that your key is in ~/.ssh/authorized_keys on the node")))
    return Snapshot(taken_at=1_763_700_000.0, duration=0.42, hangscope_version="0.1.0",
                    options=CollectOptions(locals=True, strace_seconds=2.0, gdb=True), nodes=tuple(nodes),
                    ranks=tuple(ranks))


def test_builder_round_trips_through_the_snapshot_format() -> None:
    snap = make_snapshot("dataloader", failed_node=True)
    back, analysis = snapshot_from_json(snapshot_to_json(snap))
    assert back == snap and analysis is None
    assert len(snap.ranks) == 8 and snap.rank_by_number(5) is not None


def test_builder_plants_every_secret() -> None:
    text = snapshot_to_json(make_snapshot("dataloader"))
    for value in list(SECRETS.values()) + list(HARMLESS.values()):
        assert value in text.replace("\\'", "'") or value in text, value


def test_the_node_table_shows_the_failed_nodes_first_and_says_how_many_more() -> None:
    """At thousands of nodes the page lists the nodes with a problem and counts the rest (issue 27)."""
    from app.report.html_ranks import MAX_NODE_ROWS, nodes_table

    nodes = [NodeStatus(name=f"n{i:05d}", state="done") for i in range(3 * MAX_NODE_ROWS)]
    nodes[700] = NodeStatus(name="n00700", state="failed", error=ErrorInfo(code="timeout", message="no answer"))
    html = nodes_table(nodes)
    assert html.count("<tr>") == 1 + MAX_NODE_ROWS + 1  # header, the rows shown, "and N more"
    assert html.index("n00700") < html.index("n00000")
    assert f"and {3 * MAX_NODE_ROWS - MAX_NODE_ROWS:,} more nodes (all done)" in html
    assert nodes_table(nodes[:10]).count("<tr>") == 11  # few nodes: every one, nothing said
