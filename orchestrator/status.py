"""The status protocol: <sweep>/<run>/status.json, written by the agent (and the controller when it claims a run)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Dict, Optional

from .store import Store, get_json, put_json

# States. Final ones are never left by themselves; `stopped` (orch down) resumes on the next launch.
QUEUED, STARTING, RUNNING = "queued", "starting", "running"
SUCCEEDED, FAILED, CANCELLED = "succeeded", "failed", "cancelled"
INTERRUPTED, LOST, STOPPED = "interrupted", "lost", "stopped"
ACTIVE = (STARTING, RUNNING)


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


def status_key(sweep: str, run_id: str) -> str:
    return f"{sweep}/{run_id}/status.json"


def read_status(store: Store, sweep: str, run_id: str) -> RunStatus:
    data = get_json(store, status_key(sweep, run_id))
    if not isinstance(data, dict):
        return RunStatus(run_id=run_id)
    known = {f.name for f in fields(RunStatus)}
    return RunStatus(**{k: v for k, v in data.items() if k in known})


def write_status(store: Store, sweep: str, status: RunStatus) -> None:
    put_json(store, status_key(sweep, status.run_id), asdict(status))
