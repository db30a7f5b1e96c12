"""A plain-Python stand-in for a hung training rank (~13 MB): a loop blocked in recv() under torchrun's env.

Large benchmark clusters cannot hold hundreds of torch ranks (~315 MB each), so each fake rank is this script:
the launcher's environment (RANK, LOCAL_RANK, WORLD_SIZE, ...) makes discovery find it as a rank, and its
stack (main -> train loop -> all_reduce -> recv) has the shape of a hung collective, with a loop variable
for --locals. It writes argv[1] once blocked, so the benchmark waits on files, never on a sleep.

    RANK=0 LOCAL_RANK=0 WORLD_SIZE=4 python3 bench/stand_in_rank.py READY_FILE [DEPTH]

DEPTH (default 0) puts that many model-like frames, each with two locals, between the training loop and the
collective: the ~60-frame stacks of a real torch rank (bench/scale.py records both shapes).
"""

from __future__ import annotations

import os
import socket
import sys


def all_reduce(peer: socket.socket, ready: str, step: int) -> bytes:
    # The first collective of the hung step: say so, then wait for a peer that never sends.
    with open(ready, "w") as f:
        f.write(f"{os.getpid()} {step}\n")
    return peer.recv(1)


def forward(depth: int, peer: socket.socket, ready: str, step: int) -> bytes:
    # a model's nested modules: each frame has locals of its own, as py-spy --locals reports them
    layer, activations = depth, [step] * 2
    if depth <= 0:
        return all_reduce(peer, ready, step)
    return forward(layer - 1, peer, ready, activations[0])


def train(ready: str, steps: int = 10, depth: int = 0) -> None:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    client = socket.create_connection(srv.getsockname())
    peer, _ = srv.accept()
    hung_step = int(os.environ.get("RANK", "0")) % 3 + 5  # a few ranks one step apart, as in a real hang
    for step in range(steps):
        if step == hung_step:
            forward(depth, peer, ready, step) if depth else all_reduce(peer, ready, step)
            break
    client.close()


if __name__ == "__main__":
    train(sys.argv[1], depth=int(sys.argv[2]) if len(sys.argv) > 2 else 0)
