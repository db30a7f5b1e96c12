"""PyTorch's Flight Recorder as read for one rank: its process groups and newest collectives."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple


@dataclass(frozen=True)
class FlightGroup:
    """One process group in a rank's Flight Recorder record: how far its collectives got on this rank."""

    pg_id: str  # the recorder's id of the group ("0" is the default group)
    name: str = ""  # the group's name or description, when the recorder has one
    last_enqueued: Optional[int] = None  # collective_seq_id of the last collective this rank issued
    last_started: Optional[int] = None  # None when not tracked (gloo never marks a start)
    last_completed: Optional[int] = None
    last_collective: str = ""  # profiling_name of the group's newest entry, e.g. "gloo:all_reduce"
    # the group across ranks: `pg_id` counts only the groups this rank is a member of (ranks in other subgroups
    # number theirs otherwise); torch's group name (its entries' process_group) and member ranks (pg_config) do
    # not, and name one group on every rank
    global_name: str = ""
    members: Tuple[int, ...] = ()  # global ranks, from pg_config; () when not recorded


@dataclass(frozen=True)
class FlightEntry:
    """One recorded collective (only the newest entries travel back from the node)."""

    pg_id: str
    collective_seq_id: int
    profiling_name: str = ""
    state: str = ""  # scheduled, started, completed (gloo: always scheduled)
    retired: bool = False
    is_p2p: bool = False
    p2p_seq_id: int = 0
    record_id: int = 0
    pg_name: str = ""  # torch's name of the group (process_group[0]): the same on every rank


@dataclass(frozen=True)
class FlightRecord:
    """PyTorch's Flight Recorder for one rank, when its environment enables it (TORCH_FR_BUFFER_SIZE)."""

    source: str = ""  # worker_server, dump_file, or "" when no record could be read
    path: str = ""  # the socket or file it was read from
    version: str = ""
    groups: Tuple[FlightGroup, ...] = ()
    entries: Tuple[FlightEntry, ...] = ()  # newest last
    entries_total: int = 0  # entries the recorder held
    written_at: Optional[float] = None  # a dump file's mtime (epoch seconds); None for a live record
    notes: Tuple[str, ...] = ()  # why a source gave nothing
