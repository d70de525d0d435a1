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
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import Enum

from orchestrator.backends.base import Backend, Host
from orchestrator.control import notify, summary
from orchestrator.control.lease import Lease
from orchestrator.control.notify_events import facts_of
from orchestrator.control.prune import Rungs, Verdict
from orchestrator.control.state import State
from orchestrator.control.table import RunTable
from orchestrator.control.target import reached_in_files
from orchestrator.control.trials import Trials
from orchestrator.control.views import Progress, RunView, usd, view_of
from orchestrator.errors import OrchError
from orchestrator.store import layout
from orchestrator.store import lifecycle as life
from orchestrator.store.base import Store, get_json, put_json, read_jsonl
from orchestrator.store.lifecycle import StopReason
from orchestrator.store.status import (
    ACTIVE,
    CANCELLED,
    CORRUPT,
    FAILED,
    PRUNED,
    QUEUED,
    STARTING,
    SUCCEEDED,
    RunStatus,
    update_status,
    write_if,
)
from orchestrator.sweep import record as sweep_record
from orchestrator.sweep.spec import RunSpec, Sweep
from orchestrator.wait import retry_until

log = logging.getLogger("orch.controller")


class Action(str, Enum):
    """What a run needs now (decide()'s answer)."""

    WAIT = "wait"  # it runs, or must not run again yet
    START = "start"  # a new attempt may start
    DONE = "done"  # final: never read again
    REPLACE = "replace"  # its host is lost: the verdict, then the host goes


WAIT, START, DONE, REPLACE = Action.WAIT, Action.START, Action.DONE, Action.REPLACE
MAX_NO_SHOWS = 3  # attempts whose host never reported before the run fails for good
# On a store that bills each request (S3), what a pass reads besides what changed:
REREAD_S = 30.0  # a followed run's record at least this often (its newest metrics line for the live table)
TOUCHED_S = 10.0  # `orch cancel`'s markers this often (a cancel also stops the run's host, which a pass sees at once)
SWEEP_CHECK_S = 60.0  # the sweep's own record (gone: the store was emptied under the controller)


def decide(
    status: RunStatus, host: Host | None, max_restarts: int, now: float, stale_s: float, start_timeout_s: float
) -> Action:
    """What a run needs now: wait (it runs, or must not run again yet), start, replace its host, or done.

    A host is given until its start deadline (counted from when its agent was started, which on
    AWS comes after a boot of minutes) for the agent's first report; after that the agent must
    keep heartbeating.
    """
    if status.state in (SUCCEEDED, CANCELLED, PRUNED):
        return DONE
    if status.state == CORRUPT:
        # No verdict can be read in it, so none is taken as final: with a host, its agent writes it over at its next
        # beat; without one, the run gets a new attempt (Controller._start), numbered after those the store has logs of.
        return WAIT if host is not None else START
    if host is not None:
        if status.state in ACTIVE and status.heartbeat and now - max(status.heartbeat, host.seen or 0) > stale_s:
            return REPLACE  # its agent stopped talking: treat the host as lost
        if status.state in ACTIVE and host.missing and not host.provisioning:
            return REPLACE  # a node of a multi-node attempt is gone: the attempt ends for all its nodes
        if status.state == STARTING and not status.heartbeat and not host.provisioning:
            deadline = host.start_deadline or ((status.started_at or now) + start_timeout_s)
            if now > deadline:
                return REPLACE  # its agent never reported, e.g. a controller died between CreateFleet and the agent
        return WAIT
    if status.state == FAILED:
        spent = status.no_shows >= MAX_NO_SHOWS or status.quick_losses >= life.MAX_QUICK_LOSSES
        return DONE if status.failures > max_restarts or spent else START
    return START  # queued, stopped, interrupted, lost, or active with its host gone


@dataclass
class Row:
    """One run in a pass: its spec, the record just read, what it needs, and its view (rebuilt from the
    record whenever the pass changes the record)."""

    run: RunSpec
    status: RunStatus
    action: Action
    view: RunView
    hosted: bool  # a live host of its current attempt was listed this pass


class Controller:
    def __init__(self, sweep: Sweep, backend: Backend, store: Store, state: State):
        self.sweep, self.backend, self.store, self.state = sweep, backend, store, state
        self.name = sweep.spec.name
        self.table = RunTable(sweep, store)
        self.rungs = Rungs(store, self.name, sweep.spec) if sweep.spec.prune is not None else None
        self._warned: set = set()  # runs warned of a `prune:` metric that no line of theirs carries
        self.reached: set = set()  # runs a metrics line of which met `target:` (sticky: a later line may fall back)
        self._published: tuple[float | None, float] = (None, 0.0)  # (spend, when) of the last summary written
        self.trials: Trials | None = None  # `search:`: the study, read at the first pass (after prepare's checks)
        self.lease: Lease | None = None  # set when the caller holds the sweep's lease: renewed each pass
        self.metered = store.metered  # each request is billed: a pass reads what changed, not every live record
        self._hosts_seen: dict[str, tuple] = {}  # run -> its host as the last pass listed it (see _due)
        self._checked: dict[str, float] = {}  # what was last read when, of the sweep's own records
        self.notifier: notify.Notifier | None = None  # `notify:`: started by run()
        self.notify_patience_s = notify.PATIENCE_S  # at the loop's end; a remote controller waits longer
        self.notify_hand_off = True  # what is still pending then goes to a background sender (not on a remote one)

    def prepare(self) -> bool:
        """Record the sweep in the store; refuse if a different sweep of that name is already there.

        Returns True when the sweep is new.
        """
        existing = check_recorded(self.sweep, self.store, self.state)
        newer = sweep_record.updated(existing, self.sweep) if existing is not None else None
        if newer is not None:  # the new target, description, ...: for status and collect by name
            put_json(self.store, layout.sweep_key(self.name), newer)
        if existing is None:
            put_json(self.store, layout.sweep_key(self.name), sweep_record.new_record(self.sweep, time.time()))
        self.state.remember(self.name, str(self.sweep.path), self.sweep.store_url, self.sweep.spec.backend)
        return existing is None

    def step(self, now: float | None = None) -> Progress:
        """One pass. It reads the records of live runs only (see table.py): O(active runs), not O(runs)."""
        now = time.time() if now is None else now
        if self._due_every(layout.sweep_key(self.name), SWEEP_CHECK_S, now) and not self.store.exists(
            layout.sweep_key(self.name)
        ):  # without it every status read would say "queued"
            raise OSError(f"{layout.sweep_key(self.name)} is gone")
        table = self.table
        if self.sweep.spec.search is not None and self.trials is None:
            self.trials = Trials(self.sweep, self.store)
        if not table.loaded:
            rows_before = summary.read(self.store, self.name, table.order, self.sweep.spec.target)
            table.load(rows_before)
            self.reached |= {rid for rid, v in (rows_before or {}).items() if v.reached}
            self._recount_reached(rows_before)
        outcomes = self._record_outcomes()
        marked = summary.touched(self.store, self.name) if self._due_every("touched", TOUCHED_S, now) else []
        table.follow(marked)  # records changed by `orch cancel` meanwhile
        hosts, every = live_hosts(self.backend)  # one call, before any status is read (see the module doc)
        table.follow(hosts)
        changed = set(marked) | set(outcomes)
        tracked = table.read_tracked(
            None if not self.metered else lambda rid: rid in changed or self._due(rid, hosts.get(rid), now), now
        )
        self._hosts_seen = {rid: _host_key(h) for rid, h in hosts.items()}
        if marked:
            summary.untouch(self.store, self.name, marked)
        rows = [self._row(rid, hosts.get(rid), now) for rid in tracked]
        budget = self.sweep.spec.budget_usd
        spend = self.backend.spend()
        for row in rows:
            if row.action == REPLACE:
                rid = row.run.run_id
                self._replace(row, hosts[rid], [h for h in every if h.run_id == rid])
            elif self.rungs is not None:
                self._rung(row, self.rungs)
        self._release_unclaimed(every, table.status)
        self._tell_trials()  # before any start asks: each ask knows every outcome so far (docs/guides/search.md)
        free = self.sweep.spec.max_parallel - len(hosts)
        started: list[str] = []
        if budget is not None and spend >= budget:
            self._stop_for_budget(rows, spend, budget)
        else:
            for row in rows:
                if row.action == START and free > 0 and not row.view.final:  # (final: pruned in this pass)
                    if self._start(row):
                        started.append(row.run.run_id)
                    free -= 1
            while free > 0:  # then the queue, in grid order: each run is read just before its claim
                rid = table.take_queued()
                if rid is None:
                    break
                row = self._row(rid, hosts.get(rid), now)
                if row.action == START:
                    if self._start(row):
                        started.append(rid)
                    free -= 1
        self._tell_trials()  # and what a start ended (a run given up at its claim)
        views = table.all_views()
        progress = Progress(
            sweep=self.name,
            runs=views,
            started=started,
            spend_usd=spend,
            budget_usd=budget,
            target=summary.target_of(self.sweep.spec.target),
        )
        self._publish(progress, now)
        if self.notifier is not None:
            self.notifier.observe(progress, facts_of(self.sweep, self.store, self.trials, progress))
        return progress

    def _due_every(self, what: str, period: float, now: float) -> bool:
        """On a metered store, whether `what` is due (read at most every `period`); always on a folder."""
        if not self.metered:
            return True
        if now - self._checked.get(what, float("-inf")) < period:
            return False
        self._checked[what] = now
        return True

    def _due(self, rid: str, host: Host | None, now: float) -> bool:
        """Whether this pass reads a followed run's record (on a metered store): when something may have
        changed it — its host came, went or changed, its agent wrote (the host's mark: local, its agent's every
        record; aws, a rung's value, by the instance's rung tags), or the host cannot say (`aws.keep_alive`, a
        `prune:` rung without a mark: packed or multi-node) — or when the record read before would make this
        pass act (start, replace, done: never on an old read), and at least every REREAD_S."""
        if (
            host is None
            or _host_key(host) != self._hosts_seen.get(rid)
            or now - self.table.read_at.get(rid, 0) >= REREAD_S
        ):
            return True
        if host.mark is None and (self.backend.hosts_outlive_runs or self.rungs is not None):
            return True
        status = self.table.status[rid]
        spec = self.sweep.spec
        return decide(status, host, spec.max_restarts, now, self.backend.stale_s, self.backend.start_timeout_s) != WAIT

    def _recount_reached(self, rows: dict[str, RunView] | None) -> None:
        """Rows whose marks were of another target (a relaunch changed it): from their metrics files, once."""
        target = self.sweep.spec.target
        if target is None or rows is None:
            return
        stale = [rid for rid, v in rows.items() if v.reached is None and v.state != QUEUED]
        self.reached |= reached_in_files(self.store, self.name, target, stale)
        for rid in stale:
            if rid in self.table.final:
                self.table.views[rid].reached = rid in self.reached
        self.table.changed = self.table.changed or bool(stale)

    def _row(self, run_id: str, host: Host | None, now: float | None = None) -> Row:
        """Decide one run from the record just read; its view goes into the table."""
        status = self.table.status[run_id]
        now = time.time() if now is None else now
        action = decide(
            status, host, self.sweep.spec.max_restarts, now, self.backend.stale_s, self.backend.start_timeout_s
        )
        row = Row(
            self.table.runs[run_id],
            status,
            action,
            self._view(status, host is not None, action == DONE),
            host is not None,
        )
        self.table.settle(run_id, row.view, action == DONE)
        return row

    def _view(self, status: RunStatus, hosted: bool, final: bool) -> RunView:
        """The run's view, from its record: the one place a pass makes one."""
        view = view_of(status, hosted, final)
        target = self.sweep.spec.target
        if target is not None:
            if target.met(status.last_metrics):
                self.reached.add(status.run_id)
            elif final and status.run_id not in self.table.final | self.reached:  # ended: lines no beat showed
                self.reached |= reached_in_files(self.store, self.name, target, [status.run_id])
            view.reached = status.run_id in self.reached
        return view

    def _show(self, row: Row, final: bool) -> None:
        """The pass changed the run's record: its view follows, into the table."""
        row.view = self._view(row.status, row.hosted, final)
        self.table.settle(row.run.run_id, row.view, final)

    def _rung(self, row: Row, rungs: Rungs) -> None:
        """`prune:` — a run whose newest line passed a rung it has not reported at: read its lines, record
        its value there, and prune it if the rung says so. A run that already ended only adds its values."""
        rid, status = row.run.run_id, row.status
        earlier = rungs.verdict_of(rid)
        if earlier is not None:  # decided before (a pass whose write lost a race, or a resumed attempt): it stands
            if status.state in ACTIVE or row.action == START:
                self._prune(row, earlier, rungs)
            return
        live = status.state in ACTIVE
        if status.metric_seen is not None:  # the agent read the run's own file: its values at the rungs
            self._warn_unseen(rid, status, rungs)
            if not rungs.due_reported(rid, status.at_rungs):
                return
            verdict = rungs.observe_reported(rid, status.at_rungs, judge=live)
        else:  # a record without them (an agent of an older orch): the store's copy, never a line past it
            if not rungs.due(rid, status.last_metrics):
                return
            lines = read_jsonl(self.store.get_bytes(layout.metrics_key(self.name, rid)))
            verdict = rungs.observe(rid, lines, judge=live)
        if verdict is not None:
            self._prune(row, verdict, rungs)

    def _warn_unseen(self, rid: str, status: RunStatus, rungs: Rungs) -> None:
        """A `prune:` metric that no line of a run past the first rung carries: no rung can compare it."""
        if status.metric_seen or rid in self._warned or not rungs.due(rid, status.last_metrics):
            return
        self._warned.add(rid)
        keys = ", ".join(sorted(status.last_metrics)[:12])
        message = (
            f"{rid}: prune compares {rungs.metric!r}, but no metrics line of this run carries it so far "
            f"(its newest line has: {keys}); it is past {rungs.p.at} {rungs.next_rung(rid):g} and cannot "
            "be compared. Set `prune.metric` to a key the command writes."
        )
        log.warning("%s", message)
        self.state.journal(self.name, "prune-metric-missing", rid, message)

    def _prune(self, row: Row, verdict: Verdict, rungs: Rungs) -> None:
        """The verdict first (the agent, seeing its record moved on, writes nothing more), then the stop:
        the command ends, and on AWS the instance goes; the slot is free for the next queued run."""
        metric, at = rungs.metric, rungs.p.at
        detail = {
            "rung": verdict.rung,
            "value": verdict.value,
            "cutoff": verdict.cutoff,
            "reported": verdict.reported,
            "kept": verdict.best_k,
            "metric": metric,
            "at": at,
        }
        base = row.status
        if base.state == CORRUPT:  # a verdict taken before stands over a record no one can read (no host runs it)
            base = life.recover(base, self._logged_attempt(base.run_id))
        status = life.prune(base, verdict.words(metric, at), detail)
        if not self._write(status, self.table.versions[status.run_id]):
            return  # decided again next pass, with the same verdict
        row.status = status
        self._show(row, True)
        self.backend.stop(status.run_id, StopReason.PRUNED)
        self.state.journal(self.name, "prune", status.run_id, status.reason)
        log.info("%s: %s", status.run_id, status.reason)

    def _publish(self, progress: Progress, now: float) -> None:
        """The summary record, when something changed (and now and then while runs are active)."""
        key = (self.table.changed, round(progress.spend_usd, 4))
        if key == (False, self._published[0]) and (progress.done or now - self._published[1] < summary.REFRESH_S):
            return
        summary.write(self.store, progress)
        self.table.changed = False
        self._published = (round(progress.spend_usd, 4), now)

    def _record_outcomes(self) -> list[str]:
        """Attempts that ended before their agent ran: the controller, the writer of claims, records them.
        Returns their runs (a pass reads them again)."""
        runs = []
        for outcome in self.backend.drain_outcomes():
            runs.append(outcome.run_id)

            def change(status: RunStatus, outcome=outcome) -> RunStatus | None:
                if status.attempt != outcome.attempt or status.state not in ACTIVE:
                    return None  # the run moved on meanwhile
                if outcome.state == QUEUED:  # not an attempt after all: back to how it was before the claim
                    return life.requeue(status, outcome.reason)
                return life.fail(status, outcome.reason)

            self.table.follow([outcome.run_id])
            if update_status(self.store, self.name, outcome.run_id, change):
                self.state.journal(self.name, f"provision-{outcome.state}", outcome.run_id, outcome.reason)
        return runs

    def _stop_for_budget(self, rows, spend: float, budget: float) -> None:
        """The budget is spent: what has not started never will (running attempts finish)."""

        def cancel(row: Row) -> None:
            reason = f"not started: budget {usd(budget)} reached (spent {usd(spend)})"
            status = life.cancel(row.status, reason)
            if not self._write(status, self.table.versions[row.run.run_id]):
                return
            row.status = status
            self.state.journal(self.name, "budget", row.run.run_id, reason)
            self._show(row, True)

        for row in rows:
            if row.action == START and not row.view.final:
                cancel(row)
        while True:
            rid = self.table.take_queued()
            if rid is None:
                break
            row = self._row(rid, None)
            if row.action == START:
                cancel(row)

    def _write(self, status: RunStatus, version: str | None) -> bool:
        """A verdict or a claim, written only over the record this pass read: if the agent wrote
        since (it is alive after all, or ended), the run is decided again on the next pass."""
        new = write_if(self.store, self.name, status, version)
        if new:
            self.table.status[status.run_id], self.table.versions[status.run_id] = status, new
            self.table.changed = True
            return True
        log.info("%s: its record changed since this pass read it; deciding again next pass", status.run_id)
        return False

    def _replace(self, row: Row, host: Host, all_hosts: list[Host]) -> None:
        status, version = row.status, self.table.versions[row.run.run_id]
        beat = status.heartbeat
        never = not beat
        if not beat:
            status = replace(status, no_shows=status.no_shows + 1)  # a new record: the cache keeps the one read
            reason = (
                f"host {host.host_id} never reported: its agent did not start ({status.no_shows} of {MAX_NO_SHOWS} "
                "such attempts)"
            )
        elif host.missing:
            reason = (
                f"{host.missing} of the attempt's {host.nodes} nodes lost (instance gone); the attempt ends on every "
                "node "
                "and the run resumes on a fresh set"
            )
        else:
            reason = f"host {host.host_id} lost: no sign of life for {time.time() - beat:.0f} s"
        spent = never and status.no_shows >= MAX_NO_SHOWS  # a replacement loop would pay for instance after instance
        if spent:
            status = life.fail(
                status,
                f"failed for good: {MAX_NO_SHOWS} hosts in a row never reported. Check the agent's log on an instance "
                f"(`aws.keep_alive: true`, then `orch attach`), the image's interpreter (`aws.python`) and tmux.",
                failure=False,
            )
        else:
            status = life.lose(status, reason)
        if not self._write(status, version):  # first the verdict: an agent that wakes up sees it is no longer the run's
            return
        row.status = status
        self._show(row, spent)
        log.warning("%s: %s; releasing its host(s)", status.run_id, reason)
        for h in all_hosts or [host]:
            self.backend.release(h)
        self.state.journal(self.name, "replace", status.run_id, reason)

    def _tell_trials(self) -> None:
        if self.trials is not None:
            self.trials.tell_finished(self.table.views, self.rungs.values if self.rungs else None)

    def _release_unclaimed(self, hosts: list[Host], statuses: dict[str, RunStatus]) -> None:
        """Hosts of an older attempt than the run's current one serve nobody: release them."""
        for host in hosts:
            status = statuses.get(host.run_id)
            if host.attempt is not None and status is not None and host.attempt < status.attempt:
                log.warning(
                    "%s: host %s of attempt %s is unclaimed (current attempt %s); releasing it",
                    host.run_id,
                    host.host_id,
                    host.attempt,
                    status.attempt,
                )
                self.backend.release(host)
                self.state.journal(self.name, "release-unclaimed", host.run_id, host.host_id)

    def _start(self, row: Row) -> bool:
        run, previous, version = row.run, row.status, self.table.versions[row.run.run_id]
        if self.trials is not None:  # a trial's params: asked of the sampler at its first start, then as recorded
            run = self.table.runs[run.run_id] = self.trials.bound(run, self.table.views)
        if previous.state == CORRUPT:
            previous = self._unreadable(previous)
        was_lost = life.preempted(previous)
        status = life.claim(previous)
        if status.quick_losses >= life.MAX_QUICK_LOSSES:
            return self._give_up(row, previous, version)
        if not self._write(status, version):  # claim it before a host exists; never over a record this pass did not see
            return False
        replaces = previous.host if was_lost and previous.host not in ("", "localhost") else ""
        params = json.dumps(run.params, sort_keys=True)
        task = self.backend.new_task(run.run_id, status.attempt, run.command, params, replaces=replaces)
        try:
            self.backend.start(task)
        except OrchError as exc:
            log.warning("could not start %s: %s", run.run_id, exc)
            self.state.journal(self.name, "start-failed", run.run_id, str(exc))
            return False
        self.state.journal(
            self.name,
            "start",
            run.run_id,
            f"attempt {status.attempt}" + (f" after {previous.state}" if previous.attempt else ""),
        )
        row.status, row.hosted = status, True  # its host is on its way
        self._show(row, False)
        return True

    def _unreadable(self, corrupt: RunStatus) -> RunStatus:
        """A record that cannot be read and no host of the run: taken as an attempt lost after the newest one whose
        log is in the store, so the new attempt resumes from the run's newest checkpoint under a number of its own.
        Its counts of failures and preemptions are in the unreadable record: they start again from 0."""
        rid = corrupt.run_id
        attempt = self._logged_attempt(rid)
        message = (
            f"{corrupt.reason}; no host runs it, so it gets a new attempt ({attempt + 1}), resumed from its newest "
            "checkpoint (its counts of failures and preemptions start again)"
        )
        log.warning("%s: %s", rid, message)
        self.state.journal(self.name, "unreadable-record", rid, message)
        return life.recover(corrupt, attempt)

    def _logged_attempt(self, rid: str) -> int:
        """The newest attempt of the run whose log is in the store (0: none)."""
        keys = self.store.list(layout.records_prefix(self.name, rid) + "/")
        return max(layout.logged_attempts(self.name, rid, keys), default=0)

    def _give_up(self, row: Row, previous: RunStatus, version: str | None) -> bool:
        reason = (
            f"failed for good: {life.MAX_QUICK_LOSSES} attempts in a row were lost within "
            f"{life.QUICK_LOSS_S / 60:.0f} min of their start (the agent or its host keeps dying; a spot reclaim "
            "comes with a notice). Last: "
            + (previous.reason or f"its host went away while it was {previous.state}")
            + ". See `orch logs` and the "
            "agent's log (`aws.keep_alive: true`, then `orch attach`)."
        )
        status = life.give_up(previous, reason)
        if self._write(status, version):
            row.status = status
            self._show(row, True)
            log.warning("%s: %s", previous.run_id, reason)
            self.state.journal(self.name, "give-up", previous.run_id, reason)
        return False

    def _flush(self) -> None:
        try:
            self.backend.flush()
        except Exception as exc:  # the store may be why the loop ended; the ledger's last write stands
            log.warning("could not save the cost ledger at the end: %s", exc)

    def run(self, on_progress: Callable[[Progress], None] = lambda p: None, interval: float | None = None) -> Progress:
        """Pass after pass until every run is final."""
        interval = interval or self.backend.poll_s
        last: list[Progress] = []

        def one_pass() -> bool:
            try:
                if self.lease is not None:
                    self.lease.renew()  # raises LeaseLost (the loop ends) when another controller took the sweep
                progress = self.step()
            except OSError as exc:  # the store (a folder) went away or became read-only under us
                raise OrchError(
                    f"the store {self.store.url} cannot be read or written any more ({exc.strerror or exc}). "
                    f"Runs keep going; restore the folder, then `orch launch {self.sweep.path}` continues the sweep.",
                    exit_code=2,
                ) from None
            last[:] = [progress]
            on_progress(progress)
            return progress.done

        self.notifier = notify.for_sweep(self.store, self.sweep)
        try:
            retry_until(one_pass, timeout=None, interval=interval)
        finally:
            self._flush()
            self._close_notifier()
            if self.lease is not None:
                done = bool(last and last[0].done)
                self.lease.release("every run is final" if done else "the controller's loop ended", final=done)
        return last[0]

    def _close_notifier(self) -> None:
        if self.notifier is None:
            return
        left = self.notifier.close(self.notify_patience_s)
        if left and self.notify_hand_off:
            log.info("notify: %d message(s) still pending; a background sender keeps trying", left)
            notify.hand_off(str(self.sweep.path))
        elif left:
            log.warning("notify: %d message(s) could not be delivered before the controller ended", left)


def check_recorded(sweep: Sweep, store: Store, state: State) -> dict | None:
    """What launch checks before it acts (a dry run checks the same): the sweep's record in the store, which this
    orch must be able to continue (sweep/record.py) and which must give the runs what this file gives them; and the
    name, which must not move to another store. Read-only."""
    state.check_same_store(sweep.spec.name, str(sweep.path), sweep.store_url)
    notify.check(sweep)
    existing = get_json(store, layout.sweep_key(sweep.spec.name))
    if existing is not None:
        where = f"{sweep.path}: the sweep {sweep.spec.name!r} in {store.url}"
        sweep_record.check_schema(existing, where)
        changed = sweep_record.changes(existing, sweep)
        if changed:
            raise OrchError(
                f"{sweep.path}: a different sweep named {sweep.spec.name!r} already exists in {store.url} "
                f"(changed: {', '.join(changed)}). Its results are kept: give this sweep a new `name:`, "
                f"or restore the old settings to continue it.",
                exit_code=2,
            )
    return existing


def live_hosts(backend: Backend) -> tuple[dict[str, Host], list[Host]]:
    """Live hosts: the newest attempt's node 0 (or its lowest node left) per run, and all of them (one backend call)."""
    hosts: dict[str, Host] = {}
    every = backend.list()
    for h in sorted(every, key=lambda h: h.node):
        if h.run_id not in hosts or (h.attempt or 0) > (hosts[h.run_id].attempt or 0):
            hosts[h.run_id] = h
    for run_id, h in hosts.items():  # a run spanning several hosts needs all of them
        present = sum(1 for x in every if x.run_id == run_id and x.attempt == h.attempt)
        if present < h.nodes and not h.provisioning:
            hosts[run_id] = replace(h, missing=h.nodes - present)
    return hosts, every


def _host_key(host: Host) -> tuple:
    """What of a listed host means its run may have changed (not its liveness time, which moves every beat)."""
    return (host.host_id, host.attempt, host.provisioning, host.missing, host.node, host.slot, host.mark)
