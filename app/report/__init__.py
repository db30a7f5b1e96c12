"""Export reports: one bundle (summary.md, report.html, snapshot.json, flame-graph stacks, manifest.json) a
user can attach to a ticket, shared by default-deny (app/report/share.py) with one key per bundle.

The public API is re-exported here; nothing in this package imports Textual or does network I/O.
"""

from app.report.bundle import Bundle, ExportResult, build_bundle, export_bundle, write_bundle
from app.report.redact import Redactor, redact_text, secret_name
from app.report.writer import BundleExistsError, BundleWriteError, ExportError, UnsafePathError

__all__ = ["Bundle", "ExportResult", "build_bundle", "export_bundle", "write_bundle", "Redactor", "redact_text",
           "secret_name", "ExportError", "BundleExistsError", "BundleWriteError", "UnsafePathError"]
