"""A pass runs with the garbage collector paused, and leaves it running with what the pass built frozen; the cycles
a failed pass leaves are freed at its end, and whatever clean passes leave within FULL_COLLECT_EVERY passes."""

from __future__ import annotations

import gc
import weakref
from typing import Any, Iterator

import pytest

from app.session import session as session_mod
from app.session.session import FULL_COLLECT_EVERY, gc_paused


class _Cycle:
    def __init__(self) -> None:
        self.me: Any = self


@pytest.fixture
def collections() -> Iterator[list]:
    """The generations the collector ran on, from now on."""
    ran: list = []

    def seen(phase: str, info: dict) -> None:
        if phase == "start":
            ran.append(info["generation"])

    gc.unfreeze()
    session_mod._passes_since_full[0] = 0
    gc.callbacks.append(seen)
    try:
        yield ran
    finally:
        gc.callbacks.remove(seen)
        gc.unfreeze()
        gc.collect()


def test_a_pass_pauses_the_collector_then_freezes_what_it_built() -> None:
    assert gc.isenabled()
    gc.unfreeze()
    try:
        with gc_paused():
            assert not gc.isenabled()
            built = [[i] for i in range(1000)]  # what a pass keeps
        assert gc.isenabled()
        assert gc.get_freeze_count() >= len(built)
    finally:
        gc.unfreeze()


def test_nested_or_caller_managed_collector_is_left_alone() -> None:
    gc.disable()
    try:
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the caller's choice stands
    finally:
        gc.enable()


def test_the_collector_runs_again_after_a_failed_pass() -> None:
    try:
        with gc_paused():
            raise RuntimeError("a pass failed")
    except RuntimeError:
        pass
    assert gc.isenabled()
    gc.unfreeze()


def test_the_cycles_of_a_failed_pass_are_freed_at_its_end(collections: list) -> None:
    with gc_paused() as pause:
        garbage = weakref.ref(_Cycle())  # an exception kept in a task makes such a cycle
        assert garbage() is not None
        pause.clean = False
    assert garbage() is None and 1 in collections  # collected before the freeze, not frozen with the pass


def test_a_clean_pass_is_frozen_without_walking_it_and_a_later_full_collection_frees_what_it_left(
        collections: list) -> None:
    with gc_paused() as pause:
        left = weakref.ref(_Cycle())
        built = [[i] for i in range(1000)]
        pause.clean = True
    # no collection walked the pass before the freeze (its cycle would be gone): all of it is frozen, the cycle too
    assert left() is not None and gc.get_freeze_count() >= len(built)
    for _ in range(FULL_COLLECT_EVERY - 1):
        with gc_paused() as pause:
            pause.clean = True
    assert 2 in collections and left() is None and gc.get_freeze_count() >= len(built)
