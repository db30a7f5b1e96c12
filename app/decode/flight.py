"""The worker's Flight Recorder item (workers/collect/flight.py) as a FlightRecord: pure, no I/O.

The record is the job's own data: every value is type-checked as it is taken, and numbers that the recorder
writes as strings in JSON (pg_status) and as integers in its pickle are both read.
"""

from __future__ import annotations

from typing import Any, Optional

from app.model import FlightEntry, FlightGroup, FlightRecord

MAX_TEXT = 200


def _text(value: Any, limit: int = MAX_TEXT) -> str:
    return value[:limit] if isinstance(value, str) else ""


def _seq(value: Any) -> Optional[int]:
    """A sequence number; the recorder's -1 ("none yet") and anything unreadable are None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        value = value.strip()
        if not value.lstrip("-").isdigit():
            return None
        value = int(value)
    return value if isinstance(value, int) and value >= 0 else None


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _entry(e: Any) -> Optional[FlightEntry]:
    if not isinstance(e, dict) or _seq(e.get("collective_seq_id")) is None:
        return None
    return FlightEntry(pg_id=str(e.get("pg_id"))[:40], collective_seq_id=_seq(e.get("collective_seq_id")) or 0,
                       profiling_name=_text(e.get("profiling_name")), state=_text(e.get("state"), 40),
                       retired=e.get("retired") is True, is_p2p=e.get("is_p2p") is True,
                       p2p_seq_id=_int(e.get("p2p_seq_id")), record_id=_int(e.get("record_id")),
                       pg_name=_text(e.get("pg_name"), 40))


def _group_name(config: Any) -> str:
    if not isinstance(config, dict):
        return ""
    desc = _text(config.get("desc"))
    return (desc if desc != "undefined" else "") or _text(config.get("name"))


MAX_MEMBERS = 100_000  # ranks listed for one group (a world of 100k ranks); more: not read


def _members(config: Any) -> tuple:
    """pg_config's `ranks` ("[0, 1, 2]", a list in newer torch): the group's global ranks, or () when unreadable.
    Read as digits only (never evaluated), bounded."""
    raw = config.get("ranks") if isinstance(config, dict) else None
    if isinstance(raw, list):
        items = [x for x in raw if type(x) is int and 0 <= x < 1 << 31]
        return tuple(items) if len(items) == len(raw) and len(items) <= MAX_MEMBERS else ()
    if not isinstance(raw, str) or len(raw) > 12 * MAX_MEMBERS:
        return ()
    body = raw.strip()
    if not (body.startswith("[") and body.endswith("]")):
        return ()
    parts = [p.strip() for p in body[1:-1].split(",") if p.strip()]
    if len(parts) > MAX_MEMBERS or not all(p.isdigit() and len(p) <= 10 for p in parts):
        return ()
    return tuple(int(p) for p in parts)


def flight_record(raw: Any) -> Optional[FlightRecord]:
    """None when the rank does not enable the recorder (the worker sent nothing)."""
    if not isinstance(raw, dict):
        return None
    record = raw.get("record")
    if not isinstance(record, dict):
        record = {}
    entries = tuple(e for e in (_entry(x) for x in record.get("entries") or [] if isinstance(x, dict))
                    if e is not None) if isinstance(record.get("entries"), list) else ()
    last_name = {e.pg_id: e.profiling_name for e in sorted(entries, key=lambda e: e.record_id)
                 if not e.is_p2p}
    status = record.get("pg_status")
    status = status if isinstance(status, dict) else {}
    config = record.get("pg_config")
    config = config if isinstance(config, dict) else {}
    # pg_status is keyed by the rank's own group id, pg_config by torch's group name: the entries join the two
    global_names = {e.pg_id: e.pg_name for e in entries if e.pg_name}
    descs = {str(x.get("pg_id"))[:40]: _text(x.get("pg_desc"), 60) for x in record.get("entries") or []
             if isinstance(x, dict) and isinstance(x.get("pg_desc"), str)} if isinstance(record.get("entries"), list) else {}
    groups = []
    for pg, s in status.items():
        if not isinstance(s, dict):
            continue
        pg = str(pg)[:40]
        gname = global_names.get(pg, "")
        conf = config.get(gname) if gname in config else config.get(pg)
        desc = descs.get(pg, "")
        groups.append(FlightGroup(pg_id=pg, name=_group_name(conf) or (desc if desc != "undefined" else ""),
                                  global_name=gname, members=_members(conf),
                                  last_enqueued=_seq(s.get("last_enqueued_collective")),
                                  last_started=_seq(s.get("last_started_collective")),
                                  last_completed=_seq(s.get("last_completed_collective")),
                                  last_collective=last_name.get(pg, "")))
    groups.sort(key=lambda g: (not g.pg_id.isdigit(), int(g.pg_id) if g.pg_id.isdigit() else 0, g.pg_id))
    written = raw.get("written_at")
    return FlightRecord(
        source=_text(raw.get("source"), 40) if record else "", path=_text(raw.get("path"), 500),
        version=_text(record.get("version"), 40), groups=tuple(groups), entries=entries,
        entries_total=_int(record.get("entries_total")) or len(entries),
        written_at=float(written) if isinstance(written, (int, float)) and not isinstance(written, bool) else None,
        notes=tuple(_text(n, 500) for n in raw.get("notes") or [] if isinstance(n, str))
        if isinstance(raw.get("notes"), list) else ())
