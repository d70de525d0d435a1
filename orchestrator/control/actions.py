"""What the user's one-shot commands do to a sweep, outside the controller's loop: look (`orch status`),
cancel one run, stop every live run (`orch down`), and the chaos interruption."""

from __future__ import annotations

import logging
import time

from orchestrator.backends.base import Backend
from orchestrator.backends.registry import costs_of
from orchestrator.control import deadline, summary
from orchestrator.control.decide import DONE, decide, live_hosts
from orchestrator.control.table import read_many
from orchestrator.control.views import Progress, view_of, with_places, with_whys
from orchestrator.store import layout
from orchestrator.store import lifecycle as life
from orchestrator.store.base import Store, get_json
from orchestrator.store.lifecycle import StopReason
from orchestrator.store.status import (
    ACTIVE,
    CANCELLED,
    FAILED,
    INTERRUPTED,
    PRUNED,
    SUCCEEDED,
    RunStatus,
    read_status,
    update_status,
)
from orchestrator.sweep.spec import Sweep
from orchestrator.wait import retry_until

log = logging.getLogger("orch.controller")


def observe(sweep: Sweep, backend: Backend, store: Store, every: bool = False) -> Progress:
    """What each run is doing, without acting (for `orch status`). From the summary record plus the
    records of live, hosted and touched runs — O(active runs); `every` reads every record instead."""
    name = sweep.spec.name
    order = [run.run_id for run in sweep.runs]
    doc = summary.document(store, name) if not every or sweep.spec.deadline else None  # read once, for both
    views = None if every else summary.rows(doc, name, order, sweep.spec.target)
    hosts, _ = live_hosts(backend)
    if views is None:
        fresh = order
        views = {}
    else:
        fresh = [rid for rid in order if views[rid].live or rid in hosts]
        fresh += [rid for rid in summary.touched(store, name) if rid in views and rid not in fresh]
    now = time.time()
    for rid, (status, _) in read_many(store, name, fresh).items():
        host = hosts.get(rid)
        action = decide(status, host, sweep.spec.max_restarts, now, backend.stale_s, backend.start_timeout_s)
        before = views.get(rid)
        views[rid] = view_of(status, host is not None, action == DONE)
        if sweep.spec.target is not None:
            views[rid].reached = bool((before and before.reached) or sweep.spec.target.met(status.last_metrics))
    costs = costs_of(sweep)
    ledger = (get_json(store, layout.cost_key(name)) or {}) if costs is not None else {}
    spend = costs.total(ledger) if costs is not None else 0.0
    with_places(list(views.values()), costs.places(ledger) if costs is not None else {})
    with_whys(list(views.values()), costs.whys(ledger) if costs is not None and costs.whys is not None else {})
    timely = deadline.read(summary.deadline_in(doc, name)) if sweep.spec.deadline else None
    return Progress(
        sweep=name,
        runs=[views[rid] for rid in order],
        spend_usd=spend,
        budget_usd=sweep.spec.budget_usd,
        deadline=timely,
    )


def cancel_run(sweep: Sweep, backend: Backend, store: Store, run_id: str) -> str:
    """Stop one run for good. Returns what happened, in words; a finished run is left as it is."""
    status = read_status(store, sweep.spec.name, run_id)
    final = status.state in (SUCCEEDED, CANCELLED, PRUNED) or (
        status.state == FAILED and status.failures > sweep.spec.max_restarts
    )
    if final:  # its record stays as it ended; a host still up (kept alive, or outliving its agent) is stopped
        hosted = any(h.run_id == run_id for h in backend.list()) and backend.stop(run_id, StopReason.CANCELLED)
        return f"{sweep.spec.name}/{run_id} already {status.state}; " + (
            "its host, still up, was stopped." if hosted else "nothing to cancel."
        )
    was_running = backend.stop(run_id, StopReason.CANCELLED)

    def cancelled(status: RunStatus) -> RunStatus | None:
        if status.state == CANCELLED:
            return None
        return life.cancel(status, StopReason.CANCELLED.words())

    update_status(store, sweep.spec.name, run_id, cancelled)
    summary.touch(store, sweep.spec.name, run_id)  # readers of the summary (and the controller) re-read it
    return f"cancelled {sweep.spec.name}/{run_id}" + ("" if was_running else " (it was not running)")


def stop_sweep(sweep: Sweep, backend: Backend, store: Store) -> list[str]:
    """Stop every live run of the sweep (resumable by the next launch); idempotent. Returns what was stopped.

    Touches only what is active: the runs with a host, and the claims the summary shows as live (every
    record when there is no summary)."""
    name = sweep.spec.name
    order = [run.run_id for run in sweep.runs]
    stopped = []
    hosted = []
    for host in backend.list():
        hosted.append(host.run_id)
        if backend.stop(host.run_id, StopReason.STOPPED):
            stopped.append(host.run_id)

    def stopped_claim(status: RunStatus) -> RunStatus | None:
        if status.state not in ACTIVE:
            return None
        return life.stop(status, StopReason.STOPPED.words())

    views = summary.read(store, name, order)
    candidates = order if views is None else [rid for rid in order if views[rid].live or rid in hosted]
    for rid in candidates:  # claims whose host never came up
        if update_status(store, name, rid, stopped_claim):
            summary.touch(store, name, rid)
    return stopped


def chaos_interrupt(sweep: Sweep, backend: Backend, store: Store, run_id: str, grace_s: float = 120.0) -> RunStatus:
    """A spot interruption, as the agent sees one: the notice, then (after it checkpointed) the host goes away."""
    from orchestrator.errors import NotFound
    from orchestrator.wait import Timeout

    before = read_status(store, sweep.spec.name, run_id).attempt
    hosts = [h for h in backend.list() if h.run_id == run_id]  # the hosts of the attempt being interrupted
    if not backend.notify_interruption(run_id):
        raise NotFound(f"run {run_id} has no live host to interrupt. `orch status {sweep.spec.name}` shows what runs.")
    try:
        retry_until(
            lambda: read_status(store, sweep.spec.name, run_id).state == INTERRUPTED,
            grace_s,
            0.5,
            "the agent to checkpoint",
        )
    except Timeout:
        log.warning("%s did not report the checkpoint within %.0f s; taking the host anyway", run_id, grace_s)
    # Take the host away, unless the controller already moved the run on: a new attempt's host
    # may carry the same name (a local tmux session) and must not be touched.
    # Locally the agent ends its session itself once interrupted, and the next attempt reuses the name.
    if backend.releases_interrupted_host and read_status(store, sweep.spec.name, run_id).attempt == before:
        for h in hosts:
            backend.release(h)
    return read_status(store, sweep.spec.name, run_id)


def chaos_drop(sweep: Sweep, backend: Backend, run_id: str) -> list[str]:
    """The run's host(s) go away without warning (a power cut, a network gone, a reclaim with no notice): nothing
    checkpoints; the controller finds the run hostless and resumes it from its newest checkpoint in the store."""
    from orchestrator.errors import NotFound

    hosts = [h for h in backend.list() if h.run_id == run_id]
    if not hosts:
        raise NotFound(f"run {run_id} has no live host to drop. `orch status {sweep.spec.name}` shows what runs.")
    for h in hosts:
        backend.release(h)
    return [h.host_id for h in hosts]
