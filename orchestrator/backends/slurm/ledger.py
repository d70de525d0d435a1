"""What a sweep's jobs held on a Slurm cluster, for `orch status` and `orch collect`: one entry per job in the store's
cost.json (backends/held.py), with its state and Slurm's reason as last seen. A job's GPU-hours count from when orch
first saw it running to when it saw it end (squeue, each pass); its dollars with `slurm.price_per_gpu_hour`.
"""

from __future__ import annotations

import time

from orchestrator.backends.held import HeldLedger, per_run, places, total
from orchestrator.backends.slurm.commands import Job
from orchestrator.store.base import Store

# how a job that ended without orch asking reads (squeue's state -> words)
ENDINGS = {
    "CANCELLED": "was cancelled outside orch (scancel)",
    "TIMEOUT": "reached its time limit",
    "NODE_FAIL": "lost its node",
    "PREEMPTED": "was preempted",
    "BOOT_FAIL": "could not boot its node",
    "DEADLINE": "passed its deadline",
    "OUT_OF_MEMORY": "ran out of memory",
    "FAILED": "failed",
    "REQUEUED": "was requeued by Slurm (a node failure, a preemption or `scontrol requeue`)",
}


class Ledger(HeldLedger):
    def __init__(self, store: Store | None, sweep: str, price_per_gpu_hour: float | None, gpus: int):
        super().__init__(store, sweep)
        self.price, self.gpus = price_per_gpu_hour, gpus

    def submitted(self, job: str, run: str, attempt: int) -> None:
        self._load()
        self.entries[job] = {
            "host": f"job {job}",
            "job": job,
            "run": run,
            "attempt": attempt,
            "gpus": self.gpus,
            "price_per_h": (self.price or 0.0) * self.gpus,
            "start": None,
            "end": None,
            "state": "PENDING",
            "reason": "",
        }
        self.dirty = True

    def seen(self, job: Job, run: str, attempt: int, now: float | None = None) -> None:
        """A listing showed the job: when it started running, ended, and its state and reason now."""
        self._load()
        now = time.time() if now is None else now
        entry = self.entries.get(job.id)
        if entry is None:  # submitted by a controller that died before it wrote its ledger
            self.submitted(job.id, run, attempt)
            entry = self.entries[job.id]
        reason = job.reason if job.reason != "None" else ""
        new: dict = {**entry, "state": job.state, "reason": reason, "nodes": job.nodes}
        if job.state == "RUNNING" and new.get("start") is None:
            new["start"] = now
        if not job.live and new.get("end") is None:
            new["end"] = now
        if job.restarts and not job.pending:
            new["state"] = "REQUEUED"
        if new != entry:
            self.entries[job.id] = new
            self.dirty = True

    def gone(self, listed: set[str], now: float | None = None) -> None:
        """Jobs no longer listed at all (Slurm forgets ended jobs after a while) ended by now."""
        self._load()
        for key, entry in self.entries.items():
            if isinstance(entry, dict) and entry.get("end") is None and key not in listed:
                entry["end"] = time.time() if now is None else now
                self.dirty = True

    def by_orch(self, job: str) -> None:
        """orch itself ended the job (a stop, a release): not someone else's scancel."""
        self._load()
        if job in self.entries and not self.entries[job].get("by_orch"):
            self.entries[job]["by_orch"] = True
            self.dirty = True


def _words(entry: dict) -> str:
    job, state = entry.get("job", "?"), str(entry.get("state", ""))
    if state in ("PENDING", "REQUEUED") and entry.get("end") is None:
        return f"job {job} pending ({entry.get('reason') or 'queued'})"
    if state in ("RUNNING", "COMPLETING"):
        return f"job {job} running on {entry.get('nodes') or '?'}"
    if state in ENDINGS and not entry.get("by_orch"):
        return f"job {job} {ENDINGS[state]}"
    return f"job {job} {state.lower() or 'ended'}"


def whys(ledger: dict[str, dict]) -> dict[str, dict[int, str]]:
    """run -> {attempt: its job, state and Slurm's reason}; an attempt whose previous job ended without orch asking
    (someone's scancel, a node failure, a preemption) says so too."""
    by_run: dict[str, dict[int, dict]] = {}
    for entry in ledger.values():
        if isinstance(entry, dict) and entry.get("run") and isinstance(entry.get("attempt"), int):
            by_run.setdefault(entry["run"], {})[entry["attempt"]] = entry
    out: dict[str, dict[int, str]] = {}
    for run, attempts in by_run.items():
        for attempt, entry in attempts.items():
            text = _words(entry)
            before = attempts.get(attempt - 1)
            if before is not None and before.get("state") in ENDINGS and not before.get("by_orch"):
                text += f"; {_words(before)}"
            out.setdefault(run, {})[attempt] = text
    return out


__all__ = ["Ledger", "per_run", "places", "total", "whys"]
