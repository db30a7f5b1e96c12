"""A stand-in rank whose training loop runs at module level, as nanoGPT's train.py keeps `iter_num` (run as a
script, stdlib only, any python >= 3.8): the worker tests read its loop counters from its memory. Not a test
module.

`count FILE`: a top-level `while True:` that counts `iter_num` and writes it to FILE (20 characters at offset 0)
after each increment, ~1000 times a second; says `ready PID` once the first value is written.
`churn FILE`: `count` adding, rebinding and deleting hundreds of other globals on each iteration, in bursts of
~50 iterations without a pause, so that __main__'s dict is resized and rewritten while it is read (and, between
bursts, may be read whole).
`block [STEP]`: a top-level `for step, batch in enumerate(...)` that blocks in read(2) at step STEP (3); says
`ready PID` then.
"""

import os
import sys
import time

mode = sys.argv[1]
hf_token = "hf_" + "S3cr3t" * 6  # a secret kept as a global: its text must never be read
lr = 0.5
iter_num = 0
if mode in ("count", "churn"):
    fd = os.open(sys.argv[2], os.O_WRONLY | os.O_CREAT, 0o600)
    said = False
    space = globals()
    while True:
        iter_num += 1
        os.pwrite(fd, b"%20d" % iter_num, 0)
        if not said:
            print("ready %d" % os.getpid(), flush=True)
            said = True
        if mode == "count" or iter_num % 50 == 0:
            time.sleep(0.001 if mode == "count" else 0.005)
        if mode == "count":
            continue
        for i in range(64):
            space["churn_%d" % ((iter_num * 64 + i) % 4096)] = iter_num * 1000 + i
        if iter_num % 16 == 0:
            for name in [n for n in space if n.startswith("churn_")]:
                del space[name]
else:
    block_r, block_w = os.pipe()  # nobody writes block_w: the read blocks forever
    stop = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    for step, batch in enumerate(["a", "b", "c", "d", "e"]):  # noqa: B007 (the tests read `batch` back)
        iter_num += 1
        if step == stop:
            print("ready %d" % os.getpid(), flush=True)
            os.read(block_r, 1)
