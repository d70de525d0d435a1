"""What a sweep's jobs held, as `orch status` and `orch collect` read it: GPU-hours from when a job was first seen
running to when it was seen ended, dollars only at the user's price, and each attempt's job in words."""

from __future__ import annotations

from orchestrator.backends.slurm.commands import Job
from orchestrator.backends.slurm.ledger import Ledger, per_run, total, whys


def _job(jid: str, state: str, reason: str = "None", nodes: str = "", restarts: int = 0) -> Job:
    return Job(jid, f"orch_s_r.a{jid}", state, reason, nodes, restarts, "")


def test_gpu_hours_count_while_running_and_dollars_only_at_a_price():
    priced = Ledger(None, "s", 0.5, 2)
    priced.submitted("11", "r", 1)
    priced.seen(_job("11", "PENDING", "Priority"), "r", 1, now=1000.0)
    assert whys(priced.entries) == {"r": {1: "job 11 pending (Priority)"}}
    priced.seen(_job("11", "RUNNING", nodes="gpu-07"), "r", 1, now=1000.0)
    assert whys(priced.entries) == {"r": {1: "job 11 running on gpu-07"}}
    priced.seen(_job("11", "COMPLETED"), "r", 1, now=1000.0 + 1800)
    assert per_run(priced.entries) == {"r": (0.5 * 2 * 0.5, 1.0)}  # half an hour of 2 GPUs at $0.50 a GPU-hour
    unpriced = Ledger(None, "s", None, 2)
    unpriced.entries = {k: dict(v, price_per_h=0.0) for k, v in priced.entries.items()}
    assert total(unpriced.entries) == 0.0 and per_run(unpriced.entries)["r"][1] == 1.0


def test_a_job_ended_outside_orch_is_said_so_on_the_next_attempt_and_orchs_own_is_not():
    ledger = Ledger(None, "s", None, 0)
    ledger.submitted("11", "r", 1)
    ledger.seen(_job("11", "RUNNING", nodes="n1"), "r", 1, now=10.0)
    ledger.seen(_job("11", "CANCELLED"), "r", 1, now=20.0)
    ledger.submitted("12", "r", 2)
    assert whys(ledger.entries)["r"][2] == "job 12 pending (queued); job 11 was cancelled outside orch (scancel)"
    ledger.by_orch("12")
    ledger.seen(_job("12", "CANCELLED"), "r", 2, now=30.0)
    assert whys(ledger.entries)["r"][2] == "job 12 cancelled; job 11 was cancelled outside orch (scancel)"


def test_a_job_slurm_forgot_ends_when_it_is_no_longer_listed():
    ledger = Ledger(None, "s", 1.0, 1)
    ledger.submitted("11", "r", 1)
    ledger.seen(_job("11", "RUNNING"), "r", 1, now=100.0)
    ledger.gone({"12"}, now=3700.0)
    assert per_run(ledger.entries) == {"r": (1.0, 1.0)} and ledger.entries["11"]["end"] == 3700.0
