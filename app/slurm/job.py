"""A SLURM job as hangscope needs it, parsed from `scontrol show job` text or `scontrol`/`squeue --json`.

Pure: no commands run here (resolve.py runs them). Everything in this output is remote, user-controlled text
(job names, comments): it is only ever matched against known keys and displayed, never interpreted.
"""

from __future__ import annotations

import datetime
import json
import re
from dataclasses import dataclass
from typing import Any, Literal, Optional

from app.errors import InputError

SlurmProblem = Literal["no_slurm", "no_job_id", "unknown_job", "not_running", "ambiguous", "bad_output",
                       "controller", "bad_nodes"]

# A key of `scontrol show job`: JobId, AllocNode:Sid, CPUs/Task, NtasksPerN:B:S:C ... at a word start.
_KEY = re.compile(r"(?:(?<=\s)|^)([A-Za-z][A-Za-z0-9_]*(?:[:/][A-Za-z0-9_]+)*)=")
_GPU_TRES = re.compile(r"(?:^|,)(?:gres[/:])?gpu(?::[A-Za-z0-9_.-]+)?:([0-9]+)(?:\(|,|$)")
_GPU_ALLOC = re.compile(r"(?:^|,)gres/gpu=([0-9]+)(?:,|$)")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_NONE = {"", "(null)", "None", "N/A", "Unknown"}


class SlurmError(InputError):
    """hangscope --slurm cannot go on: no SLURM here, an unknown or not-running job, unusable output."""

    title = "SLURM"

    def __init__(self, problem: SlurmProblem, message: str, *, hint: Optional[str] = None) -> None:
        super().__init__(message, hint=hint)
        self.problem = problem


@dataclass(frozen=True)
class SlurmJob:
    """One job: its nodes (expanded, in SLURM's order) and what the user recognises it by."""

    job_id: str
    name: str = ""
    state: str = ""  # RUNNING, PENDING, COMPLETING ... (the first state when SLURM gives several)
    reason: str = ""
    user: str = ""
    start_time: str = ""  # ISO 8601 local time as SLURM shows it; "" when not started
    nodelist: str = ""  # folded, e.g. gpu[001-004]
    nodes: tuple[str, ...] = ()
    num_nodes: Optional[int] = None
    gpus_per_node: Optional[int] = None  # None: the job asked for no GPUs (or SLURM did not say)
    batch_host: str = ""
    source: str = ""  # which command answered: "scontrol --json", "squeue --json", "scontrol"
    warnings: tuple[str, ...] = ()

    @property
    def running(self) -> bool:
        return self.state == "RUNNING"

    def summary(self) -> str:
        gpus = f", {self.gpus_per_node} GPU(s) per node" if self.gpus_per_node else ""
        started = f", started {self.start_time}" if self.start_time else ""
        return (f"job {self.job_id} ({self.name or 'no name'}) of {self.user or '?'}: {self.state}, "
                f"{len(self.nodes) or self.num_nodes or 0} node(s) {self.nodelist}{gpus}{started}")


def clean(text: Any, limit: int = 200) -> str:
    """Remote text made safe to show: no control characters (terminal escapes), bounded length."""
    return _CONTROL.sub("?", str(text))[:limit]


def parse_text(text: str) -> list[dict[str, str]]:
    """`scontrol show job` output: one dict per job record (records are separated by blank lines)."""
    records: list[dict[str, str]] = []
    current: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if current:
                records.append(current)
                current = {}
            continue
        matches = list(_KEY.finditer(line))
        for i, m in enumerate(matches):
            end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
            # the first spelling wins: a later Comment=... holding "NodeList=" cannot override the real one
            current.setdefault(m.group(1), line[m.end():end].strip())
    if current:
        records.append(current)
    return records


def job_from_text(rec: dict[str, str], job_id: str) -> SlurmJob:
    """A SlurmJob from one parsed `scontrol show job` record."""
    def get(key: str) -> str:
        value = rec.get(key, "")
        return "" if value in _NONE else value

    state = get("JobState").split()[0] if get("JobState") else ""
    user = get("UserId").split("(", 1)[0]
    nodelist = get("NodeList")
    num = get("NumNodes").split("-", 1)[0]
    gpus = gpus_from_tres(get("TresPerNode") or get("Gres"), get("AllocTRES"), num)
    return SlurmJob(job_id=clean(get("JobId") or job_id, 40), name=clean(get("JobName")), state=clean(state, 40),
                    reason=clean(get("Reason")), user=clean(user, 64), start_time=clean(get("StartTime"), 40),
                    nodelist=nodelist, num_nodes=int(num) if num.isdigit() else None, gpus_per_node=gpus,
                    batch_host=clean(get("BatchHost"), 255), source="scontrol")


def gpus_from_tres(per_node: str, alloc: str = "", num_nodes: str = "") -> Optional[int]:
    """GPUs per node from `gres/gpu:8`, `gres:gpu:a100:4`, `gpu:2` (older) or else AllocTRES `gres/gpu=16`."""
    m = _GPU_TRES.search(per_node or "")
    if m:
        return int(m.group(1))
    m = _GPU_ALLOC.search(alloc or "")
    if m and num_nodes.isdigit() and int(num_nodes) > 0:
        return int(m.group(1)) // int(num_nodes)
    return None


def _number(value: Any) -> Optional[int]:
    """A JSON number: plain (<= 22.05) or {"set": true, "infinite": false, "number": N} (>= 23.02)."""
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite"):
            return None
        value = value.get("number")
    if isinstance(value, bool):
        return None
    return value if isinstance(value, int) else None


def _iso(epoch: Optional[int]) -> str:
    if not epoch:
        return ""
    return datetime.datetime.fromtimestamp(epoch).strftime("%Y-%m-%dT%H:%M:%S")


def parse_json(text: str, job_id: str, source: str) -> list[SlurmJob]:
    """The jobs in `scontrol --json show job ID` or `squeue --json` output that are job_id (or its array or
    het-job parts); raises SlurmError for output that is not SLURM's JSON, or for SLURM's own errors."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise SlurmError("bad_output", f"{source} printed something that is not JSON: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("jobs"), list):
        raise SlurmError("bad_output", f"{source} printed JSON without a jobs list")
    wanted = [_job_from_json(row, source) for row in doc["jobs"] if isinstance(row, dict) and job_id in _ids(row)]
    if not wanted:
        errors = [e for e in doc.get("errors") or [] if isinstance(e, dict)]
        if errors:
            detail = "; ".join(clean(e.get("error") or e.get("description") or "", 200) for e in errors)
            raise SlurmError("unknown_job", f"SLURM does not know job {job_id}: {detail}",
                             hint="check the id with `squeue --me`; a job that ended a while ago is forgotten")
    return wanted


def _ids(row: dict) -> set[str]:
    """The ids a job row answers to: its own, and its array's or het job's, so `--slurm 900` finds 900_1."""
    ids = {str(_number(row.get("job_id")))}
    for key in ("array_job_id", "het_job_id"):
        parent = _number(row.get(key))
        if parent:
            ids.add(str(parent))
    task = _number(row.get("array_task_id"))
    if _number(row.get("array_job_id")) and task is not None:
        ids.add(f"{_number(row.get('array_job_id'))}_{task}")
    return ids


def _job_from_json(row: dict, source: str) -> SlurmJob:
    state = row.get("job_state")
    if isinstance(state, list):  # >= 23.02: a list of flags, the base state first
        state = state[0] if state else ""
    num = _number(row.get("node_count"))
    per_node = row.get("tres_per_node") or ""
    gpus = gpus_from_tres(str(per_node), str(row.get("tres_alloc_str") or ""), str(num or ""))
    nodelist = str(row.get("nodes") or "")
    return SlurmJob(job_id=clean(_number(row.get("job_id")) or row.get("job_id") or "", 40),
                    name=clean(row.get("name") or ""), state=clean(state or "", 40),
                    reason=clean(row.get("state_reason") or ""), user=clean(row.get("user_name") or "", 64),
                    start_time=_iso(_number(row.get("start_time"))), nodelist="" if nodelist in _NONE else nodelist,
                    num_nodes=num, gpus_per_node=gpus, batch_host=clean(row.get("batch_host") or "", 255),
                    source=source)
