"""The export bundle's contents: what a user reads in summary.md and report.html, the data files
(snapshot.json against its schema and back through --load, speedscope, collapsed stacks), the manifest, and
that no planted secret or hostile markup survives into any file."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import tarfile
from html.parser import HTMLParser
from pathlib import Path
from typing import Dict, List

import jsonschema
import pytest

from app.analysis import analyze
from app.model.codec import snapshot_from_json, snapshot_to_json
from app.report import build_bundle, export_bundle
from app.report.schema import schema_text
from test_report_build import HARMLESS, HOSTILE_NAME, SECRETS, make_snapshot

ROOT = Path(__file__).resolve().parents[2]
FILES = {"manifest.json", "summary.md", "report.html", "snapshot.json", "stacks.speedscope.json",
         "stacks.collapsed.txt"}

# speedscope's file format (src/lib/file-format-spec.ts in jlfwong/speedscope) as a JSON Schema, sampled
# profiles only: what stacks.speedscope.json must satisfy for speedscope to open it.
SPEEDSCOPE_SCHEMA = {
    "type": "object",
    "required": ["$schema", "shared", "profiles"],
    "properties": {
        "$schema": {"const": "https://www.speedscope.app/file-format-schema.json"},
        "shared": {"type": "object", "required": ["frames"], "properties": {"frames": {"type": "array", "items": {
            "type": "object", "required": ["name"], "properties": {
                "name": {"type": "string"}, "file": {"type": "string"}, "line": {"type": "number"},
                "col": {"type": "number"}}}}}},
        "profiles": {"type": "array", "items": {
            "type": "object", "required": ["type", "name", "unit", "startValue", "endValue", "samples", "weights"],
            "properties": {
                "type": {"const": "sampled"}, "name": {"type": "string"},
                "unit": {"enum": ["none", "nanoseconds", "microseconds", "milliseconds", "seconds", "bytes"]},
                "startValue": {"type": "number"}, "endValue": {"type": "number"},
                "samples": {"type": "array", "items": {"type": "array", "items": {"type": "integer", "minimum": 0}}},
                "weights": {"type": "array", "items": {"type": "number"}}}}},
        "name": {"type": "string"}, "activeProfileIndex": {"type": "number"}, "exporter": {"type": "string"},
    },
}


class _Text(HTMLParser):
    """The text a browser shows, and the elements it would build."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.text: List[str] = []
        self.tags: List[str] = []

    def handle_starttag(self, tag: str, attrs) -> None:  # type: ignore[no-untyped-def]
        self.tags.append(tag)

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def page_text(html: str) -> _Text:
    p = _Text()
    p.feed(html)
    p.close()
    return p


def export(tmp_path: Path, scenario: str, **kw) -> Dict[str, str]:  # type: ignore[no-untyped-def]
    snap = make_snapshot(scenario, failed_node=True)
    export_bundle(snap, analyze(snap), str(tmp_path / scenario), **kw)
    return {p.name: p.read_text(encoding="utf-8") for p in (tmp_path / scenario).iterdir()}


@pytest.mark.parametrize("scenario, culprit_words", [
    ("barrier", ["rank 5", "barrier"]),
    ("dataloader", ["rank 5", "_next_data"]),
    ("skip", ["rank 5", "step=6"]),
])
def test_summary_and_report_lead_with_verdict_findings_and_culprit(tmp_path: Path, scenario: str,
                                                                    culprit_words: List[str]) -> None:
    snap = make_snapshot(scenario, failed_node=True)
    analysis = analyze(snap)
    files = export(tmp_path, scenario)
    assert set(files) == FILES
    md = files["summary.md"]
    verdict_at = md.index("**Verdict:**")
    findings_at = md.index("## Findings")
    assert verdict_at < findings_at < md.index("## Equivalence classes") < md.index("## Node and rank failures")
    first = md[findings_at:].split("\n2. ")[0]
    assert all(w in first for w in culprit_words), first
    assert "node03: failed at login" in md  # the failed node, with its remedy
    assert "authorized" in md
    if scenario != "skip":
        assert md.index("## Culprit: rank 5 on node02") < md.index("## Equivalence classes")
        assert "**first divergence**" in md
    else:
        assert "step=5: ranks 0-4,6-7; step=6: rank 5" in md  # the loop-iteration split
    for c in analysis.classes:
        assert f"| {c.index + 1} | {c.label.replace('[', chr(92) + '[').replace(']', chr(92) + ']')} | {c.size} |" in md
    assert "<details><summary>Merged stack tree" in md

    page = page_text(files["report.html"])
    text = "".join(page.text)
    for f in analysis.findings:
        assert f.title.replace("`", "") in text  # code spans become <code>: the words read the same
    for c in analysis.classes:
        assert c.label in text
    assert "Culprit: rank 5 on node02" in text
    assert "script" not in page.tags and "img" not in page.tags and "link" not in page.tags


def test_snapshot_json_validates_against_the_schema_and_loads_back(tmp_path: Path) -> None:
    snap = make_snapshot("dataloader", failed_node=True)
    analysis = analyze(snap)
    export_bundle(snap, analysis, str(tmp_path / "b"))
    text = (tmp_path / "b" / "snapshot.json").read_text()
    schema = json.loads((ROOT / "docs" / "snapshot.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.Draft202012Validator(schema).validate(json.loads(text))

    back, stored = snapshot_from_json(text)
    sharing = json.loads(text)["sharing"]
    assert sharing["rule"] == "default-deny"  # the file says how its values were shared
    assert snapshot_to_json(back, stored, sharing=sharing) == text  # a stable round trip
    assert [(r.node, r.pid, r.rank) for r in back.ranks] == [(r.node, r.pid, r.rank) for r in snap.ranks]
    assert [t.frames[0].function for r in back.ranks for t in r.threads] == \
        [t.frames[0].function for r in snap.ranks for t in r.threads]
    assert stored is not None and stored["verdict"] == analysis.verdict
    assert analyze(back).verdict == analysis.verdict  # redaction kept everything the analysis looks at

    # and the CLI's --load reads it back
    out = subprocess.run([sys.executable, "-m", "app", "--load", str(tmp_path / "b" / "snapshot.json"), "--print"],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "rank 5" in out.stdout and "_next_data" in out.stdout


def test_the_schema_rejects_a_malformed_snapshot(tmp_path: Path) -> None:
    schema = json.loads((ROOT / "docs" / "snapshot.schema.json").read_text())
    doc = json.loads(snapshot_to_json(make_snapshot()))
    doc["snapshot"]["ranks"][0]["pid"] = "4100"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, schema)
    doc = json.loads(snapshot_to_json(make_snapshot()))
    doc["snapshot"]["nodes"][0]["state"] = "exploded"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, schema)


def test_the_committed_schema_is_generated_from_the_model() -> None:
    committed = (ROOT / "docs" / "snapshot.schema.json").read_text()
    assert committed == schema_text(), "app/model changed: run python -m app.report.schema docs/snapshot.schema.json"
    schema = json.loads(committed)
    assert "detects pid reuse" in json.dumps(schema["$defs"]["RankSnapshot"]["properties"]["start_time"])


def test_flame_graph_files(tmp_path: Path) -> None:
    snap = make_snapshot("barrier")
    files = export(tmp_path, "barrier")
    doc = json.loads(files["stacks.speedscope.json"])
    jsonschema.validate(doc, SPEEDSCOPE_SCHEMA)
    assert len(doc["profiles"]) == len(snap.ranks)  # one profile per rank
    frames = doc["shared"]["frames"]
    culprit = next(p for p in doc["profiles"] if p["name"].startswith("rank 5 "))
    main = culprit["samples"][0]
    assert [frames[i]["name"] for i in main][1:] == ["<module>", "main", "train", "wrapper", "barrier"]
    assert all(0 <= i < len(frames) for p in doc["profiles"] for s in p["samples"] for i in s)

    lines = files["stacks.collapsed.txt"].splitlines()
    assert all(re.fullmatch(r"[^;]+(;[^;]+)* \d+", line) for line in lines)
    counts = {line.rsplit(" ", 1)[0]: int(line.rsplit(" ", 1)[1]) for line in lines}
    assert sum(counts.values()) == sum(len(r.threads) for r in snap.ranks)
    majority = [k for k in counts if k.endswith("all_reduce (distributed_c10d.py:2501)")]
    assert [counts[k] for k in majority] == [7]


def test_manifest_says_what_where_and_what_was_redacted_or_skipped(tmp_path: Path) -> None:
    files = export(tmp_path, "dataloader")
    m = json.loads(files["manifest.json"])
    assert m["format"] == "hangscope.bundle" and m["versions"]["hangscope"]
    assert m["hosts"] == ["node01", "node02", "node03"]
    node03 = m["nodes"][2]
    assert node03["state"] == "failed" and node03["error"]["code"] == "ssh_auth"
    assert m["nodes"][0]["tools"]["py-spy"] == "0.4.3"
    by_rule = m["redactions"]["by_rule"]
    assert by_rule["secret-env"] == 4  # HF_TOKEN, WANDB_API_KEY, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY
    for rule in ("secret-flag", "url-password", "secret-local"):
        assert by_rule.get(rule, 0) >= 1, rule
    # the culprit's strace payload (a JWT in a write) is not text in a bundle: its size, never its bytes
    strace = json.loads(files["snapshot.json"])["snapshot"]["ranks"][5]["strace"]["output"]
    assert 'write(2, ""..., 120) = 120' in strace and "eyJ" not in strace
    assert any(s["item"] == "node node03" for s in m["skipped"])
    for entry in m["files"]:
        data = (tmp_path / "dataloader" / entry["name"]).read_bytes()
        assert entry["bytes"] == len(data) and entry["sha256"] == hashlib.sha256(data).hexdigest()
    assert {e["name"] for e in m["files"]} == FILES - {"manifest.json"}


@pytest.mark.parametrize("scenario", ["dataloader", "hostile", "skip"])
def test_no_secret_survives_in_any_file_and_harmless_values_do(tmp_path: Path, scenario: str) -> None:
    snap = make_snapshot(scenario, failed_node=True)
    export_bundle(snap, analyze(snap), str(tmp_path / "b"), tar=True)
    texts = {p.name: p.read_text(encoding="utf-8") for p in (tmp_path / "b").iterdir()}
    with tarfile.open(tmp_path / "b.tar.gz") as tf:
        for member in tf.getmembers():
            if member.isfile():
                texts["tar:" + member.name] = tf.extractfile(member).read().decode()  # type: ignore[union-attr]
    for name, text in texts.items():
        for key, secret in SECRETS.items():
            assert secret not in text, f"{key} leaked into {name}"
        assert "\x1b" not in text and "\x07" not in text, f"a control sequence reached {name}"
    snapshot_json = texts["snapshot.json"]
    for value in HARMLESS.values():
        assert value in snapshot_json
    assert "--keyframes" in texts["report.html"] and "--max-tokens" in texts["report.html"]


def test_hostile_names_are_text_in_html_and_inert_in_markdown(tmp_path: Path) -> None:
    files = export(tmp_path, "hostile")
    html = files["report.html"]
    page = page_text(html)
    assert HOSTILE_NAME in "".join(page.text)
    assert "<script" not in html.lower() and "<img" not in html.lower()
    assert page.tags.count("script") == 0
    md = files["summary.md"]
    # outside code spans and fences, every "<" is escaped: nothing in summary.md can become an HTML element
    prose = re.sub(r"(?s)(`{3,})\n.*?\n\1", "", md)
    prose = re.sub(r"(`+).+?\1", "", prose)
    prose = re.sub(r"</?(details|summary)>", "", prose)
    assert re.search(r"(?<!\\)<", prose) is None, prose


def test_build_bundle_is_deterministic_apart_from_creation_time() -> None:
    snap = make_snapshot("barrier")
    analysis = analyze(snap)
    a = build_bundle(snap, analysis, now=1.0)
    b = build_bundle(snap, analysis, now=1.0)
    assert a.files == b.files


def test_progress_and_gpu_tests_are_shown_when_present(tmp_path: Path) -> None:
    import dataclasses

    earlier = [dataclasses.replace(make_snapshot("skip", step=4), taken_at=1_763_700_000.0 - dt) for dt in (60, 30)]
    current = make_snapshot("skip", step=4, failed_node=True)
    analysis = analyze(current, history=earlier)
    assert analysis.progress  # the analysis tracked the ranks over the samples
    tests = {"verdict": "the link node01-node02 is slow", "matrix": {
        "nodes": ["node01", "node02"], "cells": [["ok", "slow"], ["slow", "ok"]]},
        "results": [{"node": "node02", "status": "broken", "error": "NCCL WARN <x>"}]}
    export_bundle(current, analysis, str(tmp_path / "b"), history=earlier, tests=tests)
    files = {p.name: p.read_text() for p in (tmp_path / "b").iterdir()}
    md = files["summary.md"]
    assert "## Progress over samples" in md and "| stuck |" in md
    assert "## GPU tests" in md and "the link node01-node02 is slow" in md
    page = page_text(files["report.html"])
    text = "".join(page.text)
    assert "Progress over samples" in text and "stuck" in text
    assert "GPU tests" in text and "NCCL WARN <x>" in text and "broken" in text
    assert re.search(r'<table class="matrix"><tr><th></th><th class="mono">node01</th>', files["report.html"])
    assert json.loads(files["tests.json"]) == tests
    manifest = json.loads(files["manifest.json"])
    assert manifest["snapshot"]["history_samples"] == 2 and manifest["snapshot"]["gpu_tests"] is True
    assert any(s["item"] == "earlier samples" for s in manifest["skipped"])


def test_who_waits_for_whom_is_in_the_report_under_the_culprit(tmp_path: Path) -> None:
    snap = make_snapshot("dataloader")
    analysis = analyze(snap)
    export_bundle(snap, analysis, str(tmp_path / "b"))
    html = (tmp_path / "b" / "report.html").read_text(encoding="utf-8")
    text = "".join(page_text(html).text)
    graph = analysis.waits[0]
    assert "Who waits for whom" in text and graph.edges
    assert f"culprit ({graph.confidence}):" in text and "next:" in text
    assert html.index('id="culprit"') < html.index('id="waits"') < html.index('id="findings"')


def test_the_process_tree_is_in_the_report_with_hostile_text_as_text(tmp_path: Path) -> None:
    import dataclasses

    from app.model import JobProcess

    snap = make_snapshot("dataloader")
    r = snap.ranks[0]
    mates = tuple(x.pid for x in snap.ranks if x.node == r.node)
    snap = dataclasses.replace(snap, processes=(
        JobProcess(node=r.node, pid=900, start_time=1, role="launcher", kind="torchrun", ppid=1, of=mates, job=r.job,
                   state="S", wchan="do_wait"),
        JobProcess(node=r.node, pid=901, start_time=1, role="child", kind=HOSTILE_NAME, ppid=r.pid, of=(r.pid,),
                   job=r.job, state="S")))
    export_bundle(snap, analyze(snap), str(tmp_path / "b"))
    html = (tmp_path / "b" / "report.html").read_text(encoding="utf-8")
    page = page_text(html)
    text = "".join(page.text)
    assert "Processes of the job" in text and "torchrun pid 900 [S]: sleeping in do_wait" in text
    assert f"{HOSTILE_NAME} pid 901" in text and page.tags.count("script") == 0
    tree = html.split('id="processes"', 1)[1].split("</pre>", 1)[0]
    assert tree.index("torchrun pid 900") < tree.index(f"pid {r.pid}") < tree.index("pid 901")


def test_empty_failed_and_oversized_snapshots_still_give_a_bundle(tmp_path: Path) -> None:
    import dataclasses

    from app.model import ErrorInfo, Frame, Snapshot

    empty = Snapshot(taken_at=0.0)
    for analysis in (analyze(empty), None):
        bundle = build_bundle(empty, analysis)
        assert set(bundle.files) == FILES
    snap = make_snapshot("barrier", failed_node=True)
    all_failed = dataclasses.replace(snap, ranks=(), nodes=tuple(
        dataclasses.replace(n, state="failed", error=ErrorInfo("ptrace_denied", "ptrace: denied", hint="use --sudo"))
        for n in snap.nodes))
    md = build_bundle(all_failed, analyze(all_failed)).files["summary.md"].decode()
    assert "node\\[01-03\\]: failed: ptrace denied" in md and "use --sudo" in md

    culprit = snap.ranks[5]
    main = culprit.threads[0]
    huge = dataclasses.replace(culprit, threads=(dataclasses.replace(
        main, frames=(Frame("f" * 10_000, "/deep" * 2000, 1),) + main.frames),), gdb="#0 frame\n" * 300_000)
    big = dataclasses.replace(snap, ranks=snap.ranks[:5] + (huge,) + snap.ranks[6:])
    bundle = build_bundle(big, analyze(big))
    assert len(bundle.files["report.html"]) < 600_000  # names and tool output are capped in the page...
    assert "f" * 10_000 in bundle.files["snapshot.json"].decode()  # ...never in the data
    assert any("strace/gdb output of rank 5" in item for item, _ in bundle.skipped)
    page = page_text(bundle.files["report.html"].decode())
    assert "f" * 199 + "\u2026" in "".join(page.text)



def test_a_rank_thousands_of_frames_deep_in_a_recursion_gives_the_whole_bundle(tmp_path: Path) -> None:
    """A recursive function (a tree walk, a parser, a model's own recursion) leaves a stack far deeper than
    Python's own recursion limit; every file of the bundle is written, the trees in it as deep as they allow."""
    import dataclasses

    from app.model import Frame

    snap = make_snapshot("barrier")
    culprit = snap.ranks[5]
    main = culprit.threads[0]
    recursion = tuple(Frame("visit", "/job/tree.py", 40 + i % 3) for i in range(5_000))
    deep = dataclasses.replace(culprit, threads=(dataclasses.replace(main, frames=main.frames[:1] + recursion
                                                                     + main.frames[1:]),))
    big = dataclasses.replace(snap, ranks=snap.ranks[:5] + (deep,) + snap.ranks[6:])
    result = export_bundle(big, analyze(big), str(tmp_path / "bundle"))
    assert {Path(p).name for p in result.paths} >= FILES
    page = (tmp_path / "bundle" / "report.html").read_text()
    assert page.count("visit (tree.py:4") >= 2_000  # the merged tree goes as deep as its budget of frames
    md = (tmp_path / "bundle" / "summary.md").read_text()
    assert "visit (tree.py:4" in md and "cut at" in md


GOLDEN = sorted(p for p in (ROOT / "tests" / "data").rglob("*.json")
                if '"schema": "hangscope.snapshot"' in p.read_text(encoding="utf-8")[:200])


@pytest.mark.parametrize("path", GOLDEN, ids=[p.stem for p in GOLDEN])
def test_golden_cluster_snapshots_export_to_a_bundle(tmp_path: Path, path: Path) -> None:
    """Snapshots recorded on the test cluster (tests/data/<scenario>.json, added by the lead): each one gives a
    bundle with its findings, classes and culprit, a snapshot.json that validates and loads back."""
    snap, _ = snapshot_from_json(path.read_text(encoding="utf-8"))
    analysis = analyze(snap)
    result = export_bundle(snap, analysis, str(tmp_path / "b"))
    files = {Path(p).name: Path(p).read_text(encoding="utf-8") for p in result.paths}
    schema = json.loads((ROOT / "docs" / "snapshot.schema.json").read_text())
    jsonschema.validate(json.loads(files["snapshot.json"]), schema)
    back, stored = snapshot_from_json(files["snapshot.json"])
    # the shared snapshot analyses to the verdict the bundle states: a value the verdict quotes (a cgroup's name
    # with a hex id) is hashed alike in both, under the bundle's one key
    assert stored is not None and analyze(back).verdict == stored["verdict"]
    text = "".join(page_text(files["report.html"]).text)
    # the findings as the bundle states them: a random id in a title (a temporary directory's, a cgroup's) is
    # hashed, the rest of the sentence is the analysis's
    assert [f["kind"] for f in stored["findings"]] == [f.kind for f in analysis.findings]
    for f in stored["findings"]:
        assert f["title"].replace("`", "") in text
    for c in analysis.classes:
        assert c.label in text
    md = files["summary.md"]
    assert md.index("**Verdict:**") < md.index("## Findings") if analysis.findings else True


def test_summary_says_nonblocking_only_when_it_was_asked_for() -> None:
    """Later samples (--samples, watch) are always taken without pausing the ranks: that is not `--nonblocking`."""
    import dataclasses

    from app.model import CollectOptions

    def summary(first_nonblocking: bool, last_nonblocking: bool, history: bool = True) -> str:
        first = dataclasses.replace(make_snapshot("skip"), taken_at=1_763_699_990.0,
                                    options=CollectOptions(locals=True, nonblocking=first_nonblocking))
        last = dataclasses.replace(make_snapshot("skip"), options=CollectOptions(locals=True,
                                                                                   nonblocking=last_nonblocking))
        earlier = [first] if history else []
        bundle = build_bundle(last, analyze(last, history=earlier), history=earlier, now=1.0)
        return bundle.files["summary.md"].decode()

    sampled = summary(False, True)
    assert "Collected with `--locals`." in sampled and "--nonblocking" not in sampled
    assert "This sample was taken without pausing the ranks" in sampled
    assert "Collected with `--locals`, `--nonblocking`." in summary(True, True)
    assert "--nonblocking" not in summary(False, False)
    loaded = summary(False, True, history=False)  # a saved last sample: how it was taken, never a flag claimed
    assert "--nonblocking" not in loaded and "without pausing the ranks" in loaded


def test_one_rank_on_one_node_reads_in_the_singular() -> None:
    import dataclasses

    snap = make_snapshot("barrier")
    one = dataclasses.replace(snap, nodes=snap.nodes[:1], ranks=snap.ranks[:1])
    files = build_bundle(one, analyze(one), now=1.0).files
    assert "1 rank on 1 node (" in files["summary.md"].decode()
    assert "1 rank on 1 node " in "".join(page_text(files["report.html"].decode()).text)
