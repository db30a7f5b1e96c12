"""Export reports: one bundle (summary.md, report.html, snapshot.json, flame-graph stacks, manifest.json) a
user can attach to a ticket, shared by default-deny (app/report/share.py) with one key per bundle.

The public API is re-exported here; nothing in this package imports Textual or does network I/O.
The names are loaded on first use (PEP 562): `--snapshot` and `--print` import app.report.redact and
app.report.share on every run, and importing this package must not pull in the bundle and its HTML writers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from app.report.bundle import Bundle, ExportResult, build_bundle, export_bundle, write_bundle
    from app.report.redact import Redactor, redact_text, secret_name
    from app.report.writer import BundleExistsError, BundleWriteError, ExportError, UnsafePathError

_WHERE = {
    "Bundle": "bundle", "ExportResult": "bundle", "build_bundle": "bundle", "export_bundle": "bundle",
    "write_bundle": "bundle", "Redactor": "redact", "redact_text": "redact", "secret_name": "redact",
    "ExportError": "writer", "BundleExistsError": "writer", "BundleWriteError": "writer", "UnsafePathError": "writer",
}

__all__ = ["Bundle", "ExportResult", "build_bundle", "export_bundle", "write_bundle", "Redactor", "redact_text",
           "secret_name", "ExportError", "BundleExistsError", "BundleWriteError", "UnsafePathError"]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
