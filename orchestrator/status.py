"""The status protocol: <sweep>/.orch/<run>/status.json, written by the agent (and the controller when it claims a run).

orch's own records live beside the run folder in the store, never in it: `<sweep>/<run>/` is the
run folder and holds only what the command wrote, so nothing a command writes can overwrite them.
A record that cannot be read (truncated, wrong types) is reported as `corrupt`, never a crash.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Dict, Optional

from .store import Store, put_json

# States. Final ones are never left by themselves; `stopped` (orch down) resumes on the next launch.
QUEUED, STARTING, RUNNING = "queued", "starting", "running"
SUCCEEDED, FAILED, CANCELLED = "succeeded", "failed", "cancelled"
INTERRUPTED, LOST, STOPPED = "interrupted", "lost", "stopped"
CORRUPT = "corrupt"  # the record could not be read; shown with the reason, never acted on blindly
ACTIVE = (STARTING, RUNNING)
STATES = (QUEUED, STARTING, RUNNING, SUCCEEDED, FAILED, CANCELLED, INTERRUPTED, LOST, STOPPED)


@dataclass
class RunStatus:
    """Contents of status.json."""

    run_id: str
    state: str = QUEUED
    attempt: int = 0  # 1 for the first attempt; each restart or resume adds one
    failures: int = 0  # attempts whose command failed (they count against max_restarts)
    preemptions: int = 0  # attempts lost to interruption or a vanished host (free)
    no_shows: int = 0  # attempts whose host never reported (its agent did not start); a few end the run
    host: str = ""  # where the current attempt runs
    started_at: Optional[float] = None  # of the current attempt, unix seconds
    heartbeat: Optional[float] = None  # last sign of life from the agent (None until it first reported)
    finished_at: Optional[float] = None
    exit_code: Optional[int] = None
    reason: str = ""  # why it ended, in words
    log_tail: str = ""  # last lines of the log, for failures
    last_metrics: Dict[str, Any] = field(default_factory=dict)  # newest metrics.jsonl line

    @property
    def elapsed(self) -> Optional[float]:
        if self.started_at is None:
            return None
        end = self.finished_at or self.heartbeat or time.time()
        return max(0.0, end - self.started_at)


def orch_prefix(sweep: str, run_id: str) -> str:
    """Where orch keeps a run's own records (status, logs): beside the run folder, not in it."""
    return f"{sweep}/.orch/{run_id}"


def status_key(sweep: str, run_id: str) -> str:
    return f"{orch_prefix(sweep, run_id)}/status.json"


_TYPES = {"attempt": int, "failures": int, "preemptions": int, "no_shows": int, "host": str, "reason": str, "log_tail": str,
          "started_at": (int, float, type(None)), "heartbeat": (int, float, type(None)), "finished_at": (int, float, type(None)),
          "exit_code": (int, type(None)), "last_metrics": dict}


def read_status(store: Store, sweep: str, run_id: str) -> RunStatus:
    data = store.get_bytes(status_key(sweep, run_id))
    if data is None:
        return RunStatus(run_id=run_id)
    try:
        record = json.loads(data)
    except ValueError:
        return RunStatus(run_id=run_id, state=CORRUPT, reason=f"status record {status_key(sweep, run_id)} is not JSON (truncated?)")
    problem = _problem(record)
    if problem:
        return RunStatus(run_id=run_id, state=CORRUPT, reason=f"status record {status_key(sweep, run_id)} is corrupt: {problem}")
    known = {f.name for f in fields(RunStatus)}
    return RunStatus(**{**{k: v for k, v in record.items() if k in known}, "run_id": run_id})


def _problem(record: Any) -> str:
    if not isinstance(record, dict):
        return f"a {type(record).__name__}, not an object"
    if record.get("state") not in STATES:
        return f"unknown state {record.get('state')!r}"
    for key, kind in _TYPES.items():
        if key in record and (not isinstance(record[key], kind) or (kind is int and isinstance(record[key], bool))):
            return f"{key} is {record[key]!r}"
    return ""


def write_status(store: Store, sweep: str, status: RunStatus) -> None:
    put_json(store, status_key(sweep, status.run_id), asdict(status))
