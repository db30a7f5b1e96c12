"""A lock file taken by polling (the filelock package: flock with LOCK_NB, a sleep, again): the ranks sleep in its
loop, and the process holding the file open holds the lock; the loop's own counter (its attempts) is no iteration
of the job's, so ranks waiting at one line are not split by it."""

from __future__ import annotations

from analysis_snapshots import frame, rank, snapshot, stack
from app.analysis import analyze
from app.model import Frame, KernelWait, Local, LoopInfo, OtherEnd, ThreadStack, WaitFd

SITE = "/opt/venv/lib/python3.12/site-packages/filelock"
TORCH = "/usr/lib/python3/dist-packages/torch"
LOCK = "/scratch/shared/vocab/.build.lock"
POLL = LoopInfo("while", 160, 178, "while True:", (), ("attempt",))


def polling(attempt: int) -> ThreadStack:
    frames = (frame("sleep (<built-in>:0)"),
              Frame("LockAcquisition._poll_until_acquired", f"{SITE}/_core/_acquire.py", 177, loops=(POLL,),
                    iteration=(("attempt", str(attempt)),), locals=(Local("lock_filename", repr(LOCK)),)),
              Frame("BaseFileLock.acquire", f"{SITE}/_core/_lock.py", 195),
              Frame("BaseFileLock.__enter__", f"{SITE}/_core/_lock.py", 155),
              Frame("build_vocab", "/srv/nlp/prep.py", 44, source=((44, "    with FileLock(VOCAB_LOCK):"),)),
              frame("<module> (/srv/nlp/prep.py:90)"))
    holder = OtherEnd(role="writer", pid=901, comm="python", state="S", wchan="anon_pipe_read",
                      cmdline=("python", "/srv/tools/rebuild_vocab.py", "--interactive"), fd=3)
    waits = KernelWait(syscall="clock_nanosleep", family="sleep", timeout=0.05,
                       watched=(WaitFd(target=LOCK, kind="file", access="read", others=(holder,)),))
    return ThreadStack(tid=1, name="MainThread", frames=frames, state="S", is_main=True, syscall="clock_nanosleep",
                       wchan="hrtimer_nanosleep", waits=waits)


def test_ranks_polling_a_lock_file_name_the_process_that_holds_it() -> None:
    broadcast = stack(f"broadcast ({TORCH}/distributed/distributed_c10d.py:3151)",
                      f"wrapper ({TORCH}/distributed/c10d_logger.py:83)", "load (/srv/nlp/prep.py:60)",
                      "<module> (/srv/nlp/prep.py:90)")
    ranks = [rank(r, f"host{r // 2 + 1}", () if r < 2 else broadcast, world=8,
                  threads=(polling(30 + r),) if r < 2 else ()) for r in range(8)]
    text = analyze(snapshot(ranks, locals=True)).verdict
    assert text.startswith("Likely lead: ranks 0-1 (pids 1000, 1001 on host1) are each blocked in `filelock acquire` "
                           "at `build_vocab` (prep.py:44)"), text
    assert "held by pid 901 `python /srv/tools/rebuild_vocab.py --interactive`" in text, text
    assert "attempt=" not in text  # the library's poll counter split nothing
