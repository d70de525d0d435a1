"""The status protocol: <sweep>/.orch/<run>/status.json, one record per run, one writer per field.

The agent owns the record of the attempt it runs (state while running, heartbeat, metrics, how
it ended) and writes only while the record is still its attempt's. The controller owns claims
(a new attempt), the verdicts it reaches (lost, failed for good, cancelled, stopped) and the
outcomes provisioning threads report to it. Every write is conditional on the version that was
read (S3 conditional writes; a folder lock locally), so no writer overwrites what it did not see.

orch's own records live beside the run folder in the store, never in it: `<sweep>/<run>/` is the
run folder and holds only what the command wrote, so nothing a command writes can overwrite them.
A record that cannot be read (truncated, wrong types) is reported as `corrupt`, never a crash.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, fields
from typing import Any

from orchestrator.store import layout
from orchestrator.store.base import Store, json_bytes, put_json
from orchestrator.store.layout import records_prefix, status_key
from orchestrator.store.lifecycle import (  # noqa: F401 (ACTIVE, FINAL, RunStatus: re-exported)
    ACTIVE,
    FINAL,
    RECORDED,
    RunState,
    RunStatus,
)

# The states as names (store/lifecycle.py has the type and the transitions that move between them).
QUEUED, STARTING, RUNNING = RunState.QUEUED, RunState.STARTING, RunState.RUNNING
SUCCEEDED, FAILED, CANCELLED = RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLED
INTERRUPTED, LOST, STOPPED = RunState.INTERRUPTED, RunState.LOST, RunState.STOPPED
PRUNED, CORRUPT = RunState.PRUNED, RunState.CORRUPT
STATES = RECORDED


def recorded_runs(store: Store, sweep: str) -> set[str]:
    """The runs that have a record, from one listing of the sweep's records folder (one LIST per 1,000 keys)."""
    return layout.recorded(sweep, store.list(records_prefix(sweep, "")))


_TYPES = {
    "attempt": int,
    "failures": int,
    "preemptions": int,
    "no_shows": int,
    "quick_losses": int,
    "host": str,
    "reason": str,
    "log_tail": str,
    "started_at": (int, float, type(None)),
    "heartbeat": (int, float, type(None)),
    "finished_at": (int, float, type(None)),
    "exit_code": (int, type(None)),
    "last_metrics": dict,
    "first_started_at": (int, float, type(None)),
    "pruned": dict,
    "at_rungs": dict,
    "metric_seen": (bool, type(None)),
    "moved": dict,
    "code": str,
    "work": list,
}


def read_status(store: Store, sweep: str, run_id: str) -> RunStatus:
    return read_versioned(store, sweep, run_id)[0]


def read_versioned(store: Store, sweep: str, run_id: str) -> tuple[RunStatus, str | None]:
    """The record and the version it was read at (for write_if)."""
    data, version = store.get_versioned(status_key(sweep, run_id))
    if data is None:
        return RunStatus(run_id=run_id), None
    try:
        record = json.loads(data)
    except (ValueError, RecursionError):
        return RunStatus(
            run_id=run_id, state=CORRUPT, reason=f"status record {status_key(sweep, run_id)} is not JSON (truncated?)"
        ), version
    problem = _problem(record)
    if problem:
        return RunStatus(
            run_id=run_id, state=CORRUPT, reason=f"status record {status_key(sweep, run_id)} is corrupt: {problem}"
        ), version
    known = {f.name for f in fields(RunStatus)}
    return RunStatus(**{**{k: v for k, v in record.items() if k in known}, "run_id": run_id}), version


def _problem(record: Any) -> str:
    if not isinstance(record, dict):
        return f"a {type(record).__name__}, not an object"
    if record.get("state") not in STATES:
        return f"unknown state {record.get('state')!r}"
    for key, kind in _TYPES.items():
        if key in record and (not isinstance(record[key], kind) or (kind is int and isinstance(record[key], bool))):
            return f"{key} is {record[key]!r}"
    return ""


def write_if(store: Store, sweep: str, status: RunStatus, version: str | None) -> str | None:
    """Write the record only if it is still as it was read (at `version`): the new version, or None
    (nothing written) when someone wrote since."""
    return store.put_if(status_key(sweep, status.run_id), json_bytes(asdict(status)), version)


def update_status(
    store: Store, sweep: str, run_id: str, change: Callable[[RunStatus], RunStatus | None], tries: int = 20
) -> RunStatus | None:
    """Read, change, write conditionally; on a conflicting write read again and re-apply the change.

    `change` gets the current record and returns the record to write, or None to write nothing
    (the record moved on in a way that makes this write wrong). Returns what was written, or None.
    """
    for _ in range(tries):
        current, version = read_versioned(store, sweep, run_id)
        new = change(current)
        if new is None:
            return None
        if write_if(store, sweep, new, version):
            return new
    raise OSError(f"status record of {sweep}/{run_id} kept changing under {tries} writes in a row")


def write_status(store: Store, sweep: str, status: RunStatus) -> None:
    """Unconditional: only for records nobody else can be writing (tests, and tools that repair them)."""
    put_json(store, status_key(sweep, status.run_id), asdict(status))
