"""The reconcile loop: compare the runs a sweep wants with what the backend and the store show, then act.

One pass: list live hosts (one backend call), read every run's status, decide per run (a pure
function), then start what may start. A controller that died and is started again does the same
pass and so adopts whatever still runs. Live hosts are listed *before* statuses are read: an agent
writes its final status before its host goes away, so "status says running, host gone" really
means the host was lost.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Dict, List, Optional, Tuple

from orchestrator.backends.base import Backend, Host
from orchestrator.control.state import State
from orchestrator.errors import OrchError
from orchestrator.store.base import Store, get_json, put_json
from orchestrator.store.status import (
    ACTIVE,
    CANCELLED,
    CORRUPT,
    FAILED,
    INTERRUPTED,
    LOST,
    QUEUED,
    STARTING,
    STOPPED,
    SUCCEEDED,
    RunStatus,
    read_status,
    read_versioned,
    update_status,
    write_if,
)
from orchestrator.sweep.spec import Sweep
from orchestrator.wait import retry_until

log = logging.getLogger("orch.controller")

WAIT, START, DONE, REPLACE = "wait", "start", "done", "replace"
MAX_NO_SHOWS = 3  # attempts whose host never reported before the run fails for good


@dataclass
class RunView:
    """One row of the live table."""

    run_id: str
    state: str  # as in status.json, or "queued"
    attempt: int
    failures: int
    preemptions: int
    elapsed: Optional[float]  # seconds in the current/last attempt
    metrics: Dict[str, object]  # newest metrics line
    reason: str = ""  # why it failed or stopped
    exit_code: Optional[int] = None
    log_tail: str = ""
    final: bool = False  # no further attempt will be made


@dataclass
class Progress:
    """What one pass saw and did."""

    sweep: str
    runs: List[RunView] = field(default_factory=list)
    started: List[str] = field(default_factory=list)  # run ids started in this pass
    spend_usd: float = 0.0  # realized cost so far (aws)
    budget_usd: Optional[float] = None  # the sweep's budget, if any

    @property
    def done(self) -> bool:
        return all(r.final for r in self.runs)

    def count(self, state: str) -> int:
        return sum(1 for r in self.runs if r.state == state)

    @property
    def failed(self) -> List[RunView]:
        return [r for r in self.runs if r.final and r.state == FAILED]


def decide(status: RunStatus, host: Optional[Host], max_restarts: int, now: float, stale_s: float, start_timeout_s: float) -> str:
    """What a run needs now: wait (it runs, or must not run again yet), start, replace its host, or done.

    A host is given until its start deadline (counted from when its agent was started, which on
    AWS comes after a boot of minutes) for the agent's first report; after that the agent must
    keep heartbeating.
    """
    if status.state in (SUCCEEDED, CANCELLED):
        return DONE
    if status.state == CORRUPT:
        return WAIT if host is not None else DONE  # reported with its reason; never restarted blindly
    if host is not None:
        if status.state in ACTIVE and status.heartbeat and now - status.heartbeat > stale_s:
            return REPLACE  # its agent stopped talking: treat the host as lost
        if status.state in ACTIVE and host.missing and not host.provisioning:
            return REPLACE  # a node of a multi-node attempt is gone: the attempt ends for all its nodes
        if status.state == STARTING and not status.heartbeat and not host.provisioning:
            deadline = host.start_deadline or ((status.started_at or now) + start_timeout_s)
            if now > deadline:
                return REPLACE  # its agent never reported, e.g. a controller died between CreateFleet and the agent
        return WAIT
    if status.state == FAILED:
        return DONE if status.failures > max_restarts or status.no_shows >= MAX_NO_SHOWS else START
    return START  # queued, stopped, interrupted, lost, or active with its host gone


class Controller:
    def __init__(self, sweep: Sweep, backend: Backend, store: Store, state: State):
        self.sweep, self.backend, self.store, self.state = sweep, backend, store, state
        self.name = sweep.spec.name

    def prepare(self) -> bool:
        """Record the sweep in the store; refuse if a different sweep of that name is already there.

        Returns True when the sweep is new.
        """
        existing = check_recorded(self.sweep, self.store, self.state)
        if existing is None:
            put_json(self.store, f"{self.name}/sweep.json", {"spec": self.sweep.resolved(), "launched_at": time.time(),
                                                           "spec_file": str(self.sweep.path)})
        self.state.remember(self.name, str(self.sweep.path), self.sweep.store_url, self.sweep.spec.backend)
        return existing is None

    def step(self) -> Progress:
        if get_json(self.store, f"{self.name}/sweep.json") is None:  # without it every status read would say "queued"
            raise OSError(f"{self.name}/sweep.json is gone")
        self._record_outcomes()
        hosts, every, rows, versions = survey(self.sweep, self.backend, self.store)
        budget = self.sweep.spec.budget_usd
        spend = self.backend.spend()
        progress = Progress(sweep=self.name, runs=[view for *_, view in rows], spend_usd=spend, budget_usd=budget)
        for run, status, action, view in rows:
            if action == REPLACE:
                self._replace(hosts[run.run_id], [h for h in every if h.run_id == run.run_id], status, view, versions[run.run_id])
        self._release_unclaimed(every, {run.run_id: status for run, status, _, _ in rows})
        free = self.sweep.spec.max_parallel - len(hosts)
        if budget is not None and spend >= budget:
            self._stop_for_budget(rows, spend, budget, versions)
            return progress
        for run, status, action, view in rows:
            if action == START and free > 0:
                if self._start(run, status, view, versions[run.run_id]):
                    progress.started.append(run.run_id)
                free -= 1
        return progress

    def _record_outcomes(self) -> None:
        """Attempts that ended before their agent ran: the controller, the writer of claims, records them."""
        for outcome in self.backend.drain_outcomes():
            def change(status: RunStatus, outcome=outcome) -> Optional[RunStatus]:
                if status.attempt != outcome.attempt or status.state not in ACTIVE:
                    return None  # the run moved on meanwhile
                if outcome.state == QUEUED:  # not an attempt after all: back to how it was before the claim
                    status.state, status.attempt = QUEUED, outcome.attempt - 1
                else:
                    status.state, status.failures, status.finished_at = FAILED, status.failures + 1, time.time()
                status.reason = outcome.reason
                return status

            if update_status(self.store, self.name, outcome.run_id, change):
                self.state.journal(self.name, f"provision-{outcome.state}", outcome.run_id, outcome.reason)

    def _stop_for_budget(self, rows, spend: float, budget: float, versions: Dict[str, Optional[str]]) -> None:
        """The budget is spent: what has not started never will (running attempts finish)."""
        for run, status, action, view in rows:
            if action == START:
                status.state, status.reason = CANCELLED, f"not started: budget ${budget:.2f} reached (spent ${spend:.2f})"
                status.finished_at = time.time()
                if not self._write(status, versions[run.run_id]):
                    continue
                self.state.journal(self.name, "budget", run.run_id, status.reason)
                view.state, view.reason, view.final = CANCELLED, status.reason, True

    def _write(self, status: RunStatus, version: Optional[str]) -> bool:
        """A verdict or a claim, written only over the record this pass read: if the agent wrote
        since (it is alive after all, or ended), the run is decided again on the next pass."""
        if write_if(self.store, self.name, status, version):
            return True
        log.info("%s: its record changed since this pass read it; deciding again next pass", status.run_id)
        return False

    def _replace(self, host: Host, all_hosts: List[Host], status: RunStatus, view: RunView, version: Optional[str]) -> None:
        never = not status.heartbeat
        if host.missing and not never:
            reason = (f"{host.missing} of the attempt's {host.nodes} nodes lost (instance gone); the attempt ends on every node "
                      "and the run resumes on a fresh set")
        elif never:
            status.no_shows += 1
            reason = f"host {host.host_id} never reported: its agent did not start ({status.no_shows} of {MAX_NO_SHOWS} such attempts)"
        else:
            reason = f"host {host.host_id} lost: no sign of life for {time.time() - status.heartbeat:.0f} s"
        if never and status.no_shows >= MAX_NO_SHOWS:  # a replacement loop would pay for instance after instance
            status.state, status.finished_at = FAILED, time.time()
            status.reason = (f"failed for good: {MAX_NO_SHOWS} hosts in a row never reported. Check the agent's log on an instance "
                             f"(`aws.keep_alive: true`, then `orch attach`), the image's interpreter (`aws.python`) and tmux.")
            view.final = True
        else:
            status.state, status.reason = LOST, reason
        if not self._write(status, version):  # first the verdict: an agent that wakes up sees it is no longer the run's
            return
        log.warning("%s: %s; releasing its host(s)", status.run_id, reason)
        for h in all_hosts or [host]:
            self.backend.release(h)
        self.state.journal(self.name, "replace", status.run_id, reason)
        view.state, view.reason = status.state, status.reason

    def _release_unclaimed(self, hosts: List[Host], statuses: Dict[str, RunStatus]) -> None:
        """Hosts of an older attempt than the run's current one serve nobody: release them."""
        for host in hosts:
            status = statuses.get(host.run_id)
            if host.attempt is not None and status is not None and host.attempt < status.attempt:
                log.warning("%s: host %s of attempt %s is unclaimed (current attempt %s); releasing it",
                            host.run_id, host.host_id, host.attempt, status.attempt)
                self.backend.release(host)
                self.state.journal(self.name, "release-unclaimed", host.run_id, host.host_id)

    def _start(self, run, previous: RunStatus, view: RunView, version: Optional[str]) -> bool:
        was_lost = previous.state in ACTIVE or previous.state in (INTERRUPTED, LOST)
        status = RunStatus(
            run_id=run.run_id,
            state=STARTING,
            attempt=previous.attempt + 1,
            failures=previous.failures,
            preemptions=previous.preemptions + (1 if was_lost else 0),
            no_shows=previous.no_shows,
            started_at=time.time(),
        )
        if not self._write(status, version):  # claim it before a host exists; never over a record this pass did not see
            return False
        task = self.backend.new_task(run.run_id, status.attempt, run.command, json.dumps(run.params, sort_keys=True))
        task.replaces = previous.host if was_lost and previous.host not in ("", "localhost") else ""
        try:
            self.backend.start(task)
        except OrchError as exc:
            log.warning("could not start %s: %s", run.run_id, exc)
            self.state.journal(self.name, "start-failed", run.run_id, str(exc))
            return False
        self.state.journal(self.name, "start", run.run_id, f"attempt {status.attempt}" + (f" after {previous.state}" if previous.attempt else ""))
        view.state, view.attempt, view.elapsed, view.final = STARTING, status.attempt, 0.0, False
        return True

    def run(self, on_progress: Callable[[Progress], None] = lambda p: None, interval: Optional[float] = None) -> Progress:
        """Pass after pass until every run is final."""
        interval = interval or self.backend.poll_s
        last: List[Progress] = []

        def one_pass() -> bool:
            try:
                progress = self.step()
            except OSError as exc:  # the store (a folder) went away or became read-only under us
                raise OrchError(f"the store {self.store.url} cannot be read or written any more ({exc.strerror or exc}). "
                                f"Runs keep going; restore the folder, then `orch launch {self.sweep.path}` continues the sweep.",
                                exit_code=2) from None
            last[:] = [progress]
            on_progress(progress)
            return progress.done

        retry_until(one_pass, timeout=None, interval=interval)
        return last[0]


def check_recorded(sweep: Sweep, store: Store, state: State) -> Optional[dict]:
    """What launch checks before it acts (a dry run checks the same): the sweep's record in the store,
    which must match this file; and the name, which must not move to another store. Read-only."""
    state.check_same_store(sweep.spec.name, str(sweep.path), sweep.store_url)
    existing = get_json(store, f"{sweep.spec.name}/sweep.json")
    resolved = sweep.resolved()
    if existing is not None:
        before = existing.get("spec", {})
        changed = sorted(k for k in set(before) | set(resolved) if before.get(k) != resolved.get(k)
                         and not (k == "grid_order" and k not in before))  # recorded before orch kept the order
        if changed:
            raise OrchError(
                f"{sweep.path}: a different sweep named {sweep.spec.name!r} already exists in {store.url} "
                f"(changed: {', '.join(changed)}). Its results are kept: give this sweep a new `name:`, "
                f"or restore the old settings to continue it.", exit_code=2)
    return existing


def survey(sweep: Sweep, backend: Backend, store: Store) -> Tuple[Dict[str, Host], List[Host], List[tuple]]:
    """Live hosts (newest per run, and all), per run (run, status, action, view), and the version of
    each record as read (what the controller's writes are conditional on) — a read-only look."""
    hosts: Dict[str, Host] = {}
    every = backend.list()  # one call, before any status is read (see the module doc)
    for h in sorted(every, key=lambda h: h.node):
        if h.run_id not in hosts or (h.attempt or 0) > (hosts[h.run_id].attempt or 0):
            hosts[h.run_id] = h  # the newest attempt's node 0 (or its lowest node left)
    for run_id, h in hosts.items():  # a run spanning several hosts needs all of them
        present = sum(1 for x in every if x.run_id == run_id and x.attempt == h.attempt)
        if present < h.nodes and not h.provisioning:
            hosts[run_id] = replace(h, missing=h.nodes - present)
    stale_s, start_timeout_s = backend.stale_s, backend.start_timeout_s
    now = time.time()
    rows, versions = [], {}
    for run in sweep.runs:
        status, versions[run.run_id] = read_versioned(store, sweep.spec.name, run.run_id)
        host = hosts.get(run.run_id)
        action = decide(status, host, sweep.spec.max_restarts, now, stale_s, start_timeout_s)
        lost = status.state in ACTIVE and host is None
        view = RunView(
            run_id=run.run_id, state=LOST if lost else status.state, attempt=status.attempt,
            failures=status.failures, preemptions=status.preemptions, elapsed=status.elapsed,
            metrics=status.last_metrics, reason=status.reason, exit_code=status.exit_code,
            log_tail=status.log_tail, final=action == DONE,
        )
        rows.append((run, status, action, view))
    return hosts, every, rows, versions


def observe(sweep: Sweep, backend: Backend, store: Store) -> Progress:
    """What each run is doing, without acting (for `orch status`)."""
    from orchestrator.aws.pricing import ledger_cost

    _, _, rows, _ = survey(sweep, backend, store)
    ledger = get_json(store, f"{sweep.spec.name}/cost.json") or {}
    return Progress(sweep=sweep.spec.name, runs=[view for *_, view in rows], spend_usd=ledger_cost(ledger),
                    budget_usd=sweep.spec.budget_usd)


def cancel_run(sweep: Sweep, backend: Backend, store: Store, run_id: str) -> str:
    """Stop one run for good. Returns what happened, in words; a finished run is left as it is."""
    status = read_status(store, sweep.spec.name, run_id)
    if status.state in (SUCCEEDED, FAILED, CANCELLED) and not any(h.run_id == run_id for h in backend.list()):
        if status.state != FAILED or status.failures > sweep.spec.max_restarts:
            return f"{sweep.spec.name}/{run_id} already {status.state}; nothing to cancel."
    was_running = backend.stop(run_id, CANCELLED)

    def cancelled(status: RunStatus) -> Optional[RunStatus]:
        if status.state == CANCELLED:
            return None
        status.state, status.reason, status.finished_at = CANCELLED, "cancelled by orch cancel", time.time()
        return status

    update_status(store, sweep.spec.name, run_id, cancelled)
    return f"cancelled {sweep.spec.name}/{run_id}" + ("" if was_running else " (it was not running)")


def stop_sweep(sweep: Sweep, backend: Backend, store: Store) -> List[str]:
    """Stop every live run of the sweep (resumable by the next launch); idempotent. Returns what was stopped."""
    stopped = []
    for host in backend.list():
        if backend.stop(host.run_id, STOPPED):
            stopped.append(host.run_id)
    def stopped_claim(status: RunStatus) -> Optional[RunStatus]:
        if status.state not in ACTIVE:
            return None
        status.state, status.reason = STOPPED, "stopped by orch down"
        return status

    for run in sweep.runs:  # claims whose host never came up
        update_status(store, sweep.spec.name, run.run_id, stopped_claim)
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
        retry_until(lambda: read_status(store, sweep.spec.name, run_id).state == INTERRUPTED, grace_s, 0.5, "the agent to checkpoint")
    except Timeout:
        log.warning("%s did not report the checkpoint within %.0f s; taking the host anyway", run_id, grace_s)
    # Take the host away, unless the controller already moved the run on: a new attempt's host
    # may carry the same name (a local tmux session) and must not be touched.
    # Locally the agent ends its session itself once interrupted, and the next attempt reuses the name.
    if backend.releases_interrupted_host and read_status(store, sweep.spec.name, run_id).attempt == before:
        for h in hosts:
            backend.release(h)
    return read_status(store, sweep.spec.name, run_id)
