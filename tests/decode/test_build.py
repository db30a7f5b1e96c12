"""app/decode/build.py: the generated builders make what the dataclasses' own __init__ and replace() make."""

from __future__ import annotations

import copy
import dataclasses
import pickle
import sys

import pytest

from app.decode.build import Builder
from app.model import Frame, RankSnapshot, TcpSocket, ThreadStack


def test_make_equals_init_with_derived_attributes():
    build = Builder(TcpSocket).make
    made = build(local="[::ffff:10.0.0.1]:5", peer="10.0.0.2:6", state="ESTABLISHED", send_q=3)
    assert made == TcpSocket(local="[::ffff:10.0.0.1]:5", peer="10.0.0.2:6", state="ESTABLISHED", send_q=3)
    assert (made.local_host, made.peer_host) == ("10.0.0.1", "10.0.0.2")  # __post_init__ ran
    assert made.recv_q == 0 and made.total_retrans is None  # the class's defaults
    frames = (Frame(function="f", filename="a.py", line=3),)
    thread = Builder(ThreadStack).make(tid=7, frames=frames)
    assert thread == ThreadStack(tid=7, frames=frames) and thread.path == ThreadStack(tid=7, frames=frames).path
    assert pickle.loads(pickle.dumps(thread)) == thread


def test_names_are_checked_as_init_checks_them():
    build = Builder(TcpSocket).make
    with pytest.raises(TypeError):
        build(local="a", peer="b", state="c", sendq=1)  # misspelt
    with pytest.raises(TypeError):
        build(local="a", peer="b")  # a field without a default is missing
    with pytest.raises(TypeError):
        Builder(RankSnapshot).replace(RankSnapshot(node="n", pid=1, start_time=2), colected=True)


def test_replace_equals_dataclasses_replace():
    rank = RankSnapshot(node="n", pid=1, start_time=2, rank=0, cmdline=("python", "train.py"))
    threads = (ThreadStack(tid=1, frames=(Frame(function="f", filename="a.py", line=3),)),)
    got = Builder(RankSnapshot).replace(rank, threads=threads, collected=True)
    want = dataclasses.replace(rank, threads=threads, collected=True)
    assert got == want and got.enters_with == want.enters_with
    assert rank.collected is False and rank.threads == ()  # the original is untouched


def test_a_rank_holds_its_fields_in_slots_and_still_pickles():
    """A RankSnapshot has ~50 fields, more than CPython shares a dict's key table for: on python >= 3.10 it has
    slots instead of a dict of its own (~0.4 KB against ~1.5 KB a rank; 100k ranks a pass at 12,500 nodes)."""
    threads = (ThreadStack(tid=1, frames=(Frame(function="f", filename="a.py", line=3),)),)
    rank = Builder(RankSnapshot).make(node="n", pid=1, start_time=2, rank=0, threads=threads)
    if sys.version_info >= (3, 10):
        assert not hasattr(rank, "__dict__") and sys.getsizeof(rank) < 600
    for again in (pickle.loads(pickle.dumps(rank)), copy.copy(rank), copy.deepcopy(rank)):
        assert again == rank and again.enters_with == rank.enters_with
