"""The table of `decide()` (control/decide.py): the controller's decision for one run, a pure function of its record
and its host as listed."""

from __future__ import annotations

import pytest

from orchestrator.backends.base import Host
from orchestrator.control.decide import DONE, REPLACE, START, WAIT, decide
from orchestrator.store.status import RunStatus


def test_a_corrupt_record_is_never_taken_as_final():
    """With a host, its agent writes it over; without one, the run gets a new attempt (test_unreadable_records)."""
    corrupt = RunStatus(run_id="r", state="corrupt", reason="not JSON")
    assert decide(corrupt, None, max_restarts=5, now=NOW, stale_s=60, start_timeout_s=60) == START
    assert decide(corrupt, Host("r", "h", "a"), max_restarts=5, now=NOW, stale_s=60, start_timeout_s=60) == WAIT


NOW = 1_000_000.0


def st(state, **kw):
    return RunStatus(run_id="r", state=state, **kw)


@pytest.mark.slow
@pytest.mark.parametrize(
    "status, host, want",
    [
        (st("succeeded"), None, DONE),
        (st("cancelled"), Host("r", "h", "a"), DONE),
        (st("running", heartbeat=NOW - 5), Host("r", "h", "a"), WAIT),
        (st("running", heartbeat=NOW - 500), Host("r", "h", "a"), REPLACE),  # silent agent: host lost
        (st("running", heartbeat=NOW - 5), None, START),  # host vanished
        (st("interrupted"), None, START),
        (st("starting", started_at=NOW - 500), Host("r", "i-1", "a"), REPLACE),  # orphan of a dead controller
        (st("starting", started_at=NOW - 500), Host("r", "i-1", "a", provisioning=True), WAIT),
        (st("failed", failures=1), None, START),
        (st("failed", failures=2), None, DONE),
        (st("stopped"), None, START),
        # (a) the start timeout counts from the agent's start (a boot of minutes before it is not the agent's fault)
        (st("starting", started_at=NOW - 500), Host("r", "i-1", "a", start_deadline=NOW + 10), WAIT),
        (st("starting", started_at=NOW - 500), Host("r", "i-1", "a", start_deadline=NOW - 1), REPLACE),
        (
            st("starting", started_at=NOW - 500, heartbeat=NOW - 5),
            Host("r", "i-1", "a", start_deadline=NOW - 1),
            WAIT,
        ),  # it reported: restoring
        (
            st("starting", started_at=NOW - 500, heartbeat=NOW - 500),
            Host("r", "i-1", "a"),
            REPLACE,
        ),  # reported, then went silent
        (st("failed", no_shows=3), None, DONE),  # hosts that never report end the run: no replacement loop
        (st("failed", quick_losses=5), None, DONE),  # attempts lost again and again soon after their claim: too
        (st("failed", failures=1, quick_losses=4), None, START),
        # a run on several instances needs every node of its attempt
        (st("running", heartbeat=NOW - 5), Host("r", "i-1", "a", nodes=2, missing=1), REPLACE),
        (st("starting", heartbeat=NOW - 5), Host("r", "i-1", "a", nodes=2, missing=1), REPLACE),
        (st("starting"), Host("r", "i-1", "a", nodes=2, missing=1, provisioning=True), WAIT),  # still being acquired
        (
            st("interrupted"),
            Host("r", "i-1", "a", nodes=2, missing=1),
            WAIT,
        ),  # the attempt ended: its nodes are on their way out
        (st("succeeded"), Host("r", "i-1", "a", nodes=2, missing=1), DONE),
    ],
)
def test_decide(status, host, want):
    assert decide(status, host, max_restarts=1, now=NOW, stale_s=60, start_timeout_s=60) == want
