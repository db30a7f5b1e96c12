"""The analysis: pure functions from snapshots to classes, a merged tree, findings and a verdict.

Import contract: nothing under app/analysis imports textual, asyncssh, app.transport, app.session or app.ui
(a test checks it in a subprocess). `analyze` is the entry point; everything it returns is frozen and
`Analysis.to_dict()` is what the snapshot file stores under "analysis".

The package root is thin: `from app.analysis import analyze` loads app/analysis/core.py (and with it every room,
~0.15 s) when a name is first asked for, and importing one room (the decode's coordinates, the session's outside
peers) loads that room alone. So the CLI opens its connections first and loads the analysis while the nodes
work (app/cli/headless.py, issue 27: the rooms were ~0.15 s of the CLI's start before its first connection).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from app.analysis.core import (Analysis, AnalysisOptions, Culprit, Fact, Finding, IterationSplit,
                                   RankProgress, StackClass, StackTree, TreeNode, WaitGraph, analyze, job_keys,
                                   only_job)

__all__ = ["Analysis", "AnalysisOptions", "Culprit", "Fact", "Finding", "StackClass", "StackTree", "TreeNode",
           "IterationSplit", "RankProgress", "WaitGraph", "analyze", "job_keys", "only_job"]


def __getattr__(name: str) -> Any:
    """A name of the core (analyze, Analysis, job_keys, ...), loaded on first use (PEP 562)."""
    if name.startswith("__"):
        raise AttributeError(name)
    core = importlib.import_module("app.analysis.core")
    if name in globals():  # a room the core imported (a submodule is an attribute of its package)
        return globals()[name]
    try:
        return getattr(core, name)
    except AttributeError:
        raise AttributeError(f"module 'app.analysis' has no attribute {name!r}") from None
