"""report.html's optional sections: the progress timeline (when earlier samples exist) and GPU test results
with the node-pair matrix (when tests ran). Test results are rendered from their JSON form, generically, so
the page shows whatever the test runner recorded without re-interpreting it."""

from __future__ import annotations

from typing import Any, List, Sequence

from app.report.facts import ProgressRow
from app.report.manifest import iso
from app.report.markup import VALUE, h, h_sentence

MAX_ROWS = 500
_STATUS_CSS = {"ok": "ok", "pass": "ok", "passed": "ok", "true": "ok", "broken": "fail", "failed": "fail",
               "fail": "fail", "hung": "fail", "slow": "fail", "error": "fail", "timeout": "fail", "false": "fail"}


def progress_section(rows: Sequence[ProgressRow], history_times: Sequence[float], latest: float) -> str:
    times = sorted(set(t for t in history_times if t) | {latest})
    start = min([t for t in times] + [r.since for r in rows if r.since])
    span = latest - start
    out = ["<h2 id=\"progress\">Progress over samples</h2>",
           f"<p class=\"meta\">{len(times)} samples from {h(iso(start) or '?')} to {h(iso(latest) or '?')}. "
           "A bar spans the time a rank's stack and loop iteration stayed the same (for a gone rank: until it "
           "was last seen).</p>",
           "<table class=\"timeline\"><tr><th>ranks</th><th>status</th><th>since</th><th>for</th><th>activity</th>"
           "<th class=\"timeline\">timeline</th></tr>"]
    for r in rows:
        bar = ""
        if span > 0 and r.since:
            if r.status == "gone":
                offset, width = 0, _pct(r.since - start, span)
            else:
                offset = _pct(r.since - start, span)
                width = max(1, 100 - offset)
            bar = f"<div class=\"track\"><div class=\"bar {h(r.status)} o{offset} w{width}\"></div></div>"
        out.append(f"<tr><td>{h(r.label, 400)}</td><td class=\"{'fail' if r.status == 'stuck' else ''}\">"
                   f"{h(r.status)}</td><td>{h(iso(r.since) or '?')}</td><td>{r.duration:.0f} s</td>"
                   f"<td>{h(r.activity)}</td><td>{bar}</td></tr>")
    out.append("</table>")
    return "\n".join(out)


def _pct(part: float, whole: float) -> int:
    return max(0, min(100, round(100 * part / whole)))


def tests_section(doc: Any) -> str:
    out = ["<h2 id=\"tests\">GPU tests</h2>"]
    if isinstance(doc, dict):
        verdict = doc.get("verdict") or doc.get("summary")
        if isinstance(verdict, str):
            out.append(f"<div class=\"verdict\">{h_sentence(verdict)}</div>")
        for name, matrix in _matrices(doc):
            out.append(f"<h3>{h(name)}</h3>" + matrix)
    out.append(f"<details open><summary>everything the test recorded</summary>{_value(doc, 0)}</details>")
    return "\n".join(out)


def _matrices(doc: Any, path: str = "") -> List[tuple]:
    """Node x node tables: any object with a list of `nodes` and a square list of lists (`matrix`/`cells`)."""
    found = []
    if isinstance(doc, dict):
        nodes = doc.get("nodes")
        cells = doc.get("matrix", doc.get("cells"))
        if (isinstance(nodes, list) and isinstance(cells, list) and len(cells) == len(nodes)
                and all(isinstance(row, list) and len(row) == len(nodes) for row in cells)):
            found.append((path or "pair matrix", _matrix_table([str(n) for n in nodes], cells)))
        for k, v in doc.items():
            found.extend(_matrices(v, f"{path}.{k}" if path else str(k)))
    return found[:8]


def _matrix_table(nodes: List[str], cells: List[list]) -> str:
    head = "<tr><th></th>" + "".join(f"<th class=\"mono\">{h(n)}</th>" for n in nodes) + "</tr>"
    rows = []
    for n, row in zip(nodes, cells):
        tds = "".join(f"<td class=\"{_css(v)}\">{h(_scalar(v), 80)}</td>" for v in row)
        rows.append(f"<tr><th class=\"mono\">{h(n)}</th>{tds}</tr>")
    return f"<table class=\"matrix\">{head}{''.join(rows)}</table>"


def _value(v: Any, depth: int) -> str:
    if isinstance(v, dict):
        if not v:
            return "<span class=\"meta\">(empty)</span>"
        rows = "".join(f"<tr><th>{h(k)}</th><td>{_value(x, depth + 1)}</td></tr>" for k, x in v.items())
        return f"<table>{rows}</table>"
    if isinstance(v, list):
        if v and all(isinstance(x, dict) for x in v):
            return _records(v, depth)
        if all(not isinstance(x, (dict, list)) for x in v):
            return h(", ".join(_scalar(x) for x in v[:MAX_ROWS]), VALUE * 4)
        return "<ul>" + "".join(f"<li>{_value(x, depth + 1)}</li>" for x in v[:MAX_ROWS]) + "</ul>"
    return f"<span class=\"{_css(v)}\">{h(_scalar(v), VALUE * 4, multiline=True)}</span>"


def _records(items: List[dict], depth: int) -> str:
    cols: List[str] = []
    for item in items[:MAX_ROWS]:
        cols.extend(k for k in item if k not in cols)
    head = "<tr>" + "".join(f"<th>{h(c)}</th>" for c in cols) + "</tr>"
    body = "".join("<tr>" + "".join(f"<td>{_value(item.get(c, ''), depth + 1)}</td>" for c in cols) + "</tr>"
                   for item in items[:MAX_ROWS])
    more = f"<p class=\"meta\">{len(items) - MAX_ROWS} more rows in tests.json</p>" if len(items) > MAX_ROWS else ""
    return f"<table>{head}{body}</table>{more}"


def _scalar(v: Any) -> str:
    if v is None:
        return "\u2014"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _css(v: Any) -> str:
    """A status word (ok, failed, hung, ...) gets its colour; numbers never do."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return ""
    return _STATUS_CSS.get(_scalar(v).strip().lower(), "")
