"""The Flight Recorder's two records: torch keeps NCCL's collectives in a recorder of their own, served by the
worker server's `dump_nccl_trace_json` handler (CUDA builds), beside `fr_trace_json` (the CPU one). Seen on an
H100 (make gpu-check): a hung NCCL job's ranks answered fr_trace_json with no entries at all.

The one fake here is the worker server: a CUDA build of torch cannot run on this machine, so a unix-socket HTTP
server in this process answers the two handlers with records shaped as torch writes them; the worker asks it
exactly as it asks a rank's (it checks that this process listens on the socket first)."""

from __future__ import annotations

import http.server
import json
import os
import socketserver
import threading
from pathlib import Path
from typing import Dict, Iterator, Optional

import pytest

from workers.collect import flight


def _entry(record_id: int, pg: str, seq: int, name: str, created: int) -> dict:
    return {"record_id": record_id, "pg_id": pg, "collective_seq_id": seq, "p2p_seq_id": 0, "op_id": seq,
            "profiling_name": name, "state": "scheduled", "retired": False, "is_p2p": False,
            "time_created_ns": created}


CPU = {"version": "2.10", "pg_config": {"1": {"name": "1", "desc": "gloo", "ranks": "[0, 1, 2]"}},
       "pg_status": {"1": {"last_enqueued_collective": 4, "last_started_collective": 4,
                           "last_completed_collective": 3}},
       "entries": [_entry(0, "1", 4, "gloo:all_reduce", 200)]}
NCCL = {"version": "2.10", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2]"}},
        "pg_status": {"0": {"last_enqueued_collective": 3, "last_started_collective": 3,
                            "last_completed_collective": 2}},
        "entries": [_entry(0, "0", 2, "nccl:all_reduce", 100), _entry(1, "0", 3, "nccl:all_reduce", 300)]}


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


def _serve(path: str, answers: Dict[str, Optional[dict]]) -> _Server:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = answers.get(self.path.split("?")[0])
            data = json.dumps(body).encode() if body is not None else b"Handler not found"
            self.send_response(200 if body is not None else 404)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = _Server(path, Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def socket_path(tmp_path: Path) -> Iterator[str]:
    yield str(tmp_path / "rank0.sock")


def _collect(path: str) -> dict:
    env = {"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_WORKER_SERVER_SOCKET": path, "RANK": "0"}
    out = flight.collect(os.getpid(), timeout=3.0, env=env)
    assert out is not None and out["source"] == "worker_server", out
    return out["record"]


def test_a_cuda_build_serves_nccls_record_beside_the_cpu_one_and_both_are_merged(socket_path: str) -> None:
    server = _serve(socket_path, {"/handler/fr_trace_json": CPU, "/handler/dump_nccl_trace_json": NCCL})
    try:
        record = _collect(socket_path)
    finally:
        server.shutdown()
        server.server_close()
    assert set(record["pg_status"]) == {"0", "1"} and set(record["pg_config"]) == {"0", "1"}
    assert record["pg_status"]["0"]["last_enqueued_collective"] == 3
    # in the order they were created, across the two recorders
    assert [(e["pg_id"], e["collective_seq_id"]) for e in record["entries"]] == [("0", 2), ("1", 4), ("0", 3)]
    assert record["entries_total"] == 3


def test_a_cpu_build_answers_404_for_nccl_and_its_own_record_stands(socket_path: str) -> None:
    server = _serve(socket_path, {"/handler/fr_trace_json": CPU})
    try:
        record = _collect(socket_path)
    finally:
        server.shutdown()
        server.server_close()
    assert set(record["pg_status"]) == {"1"} and [e["profiling_name"] for e in record["entries"]] == ["gloo:all_reduce"]


def test_merge_takes_what_each_record_has_and_ignores_junk() -> None:
    assert flight.merge(CPU, "junk") is CPU and flight.merge(None, NCCL) is NCCL
    both = flight.merge({"entries": "x"}, {"version": "2.10", "entries": [1, {"record_id": 0}]})
    assert both["version"] == "2.10" and both["entries"] == [{"record_id": 0}]
