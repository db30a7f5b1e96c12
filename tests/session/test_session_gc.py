"""A pass runs with the garbage collector paused, and leaves it running with what the pass built frozen."""

from __future__ import annotations

import gc

from app.session.session import gc_paused


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
