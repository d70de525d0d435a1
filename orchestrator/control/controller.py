"""The reconcile loop: compare the runs a sweep wants with what the backend and the store show, then act.

One pass: list live hosts (one backend call), read every run's status, decide per run (a pure
function: decide.py), write the verdicts (verdicts.py), then start what may start. A controller
that died and is started again does the same pass and so adopts whatever still runs. Live hosts
are listed *before* statuses are read: an agent writes its final status before its host goes
away, so "status says running, host gone" really means the host was lost.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable

from orchestrator.backends.base import Backend, Host
from orchestrator.control import code, notify, raised, summary
from orchestrator.control.deadline import DeadlineView, schedule
from orchestrator.control.deadline import moment as deadline_moment
from orchestrator.control.decide import DONE, REPLACE, START, WAIT, Row, decide, host_key, live_hosts
from orchestrator.control.ended import EndedHosts
from orchestrator.control.lease import Lease
from orchestrator.control.notify_events import facts_of
from orchestrator.control.prune import Rungs
from orchestrator.control.recorded import check_recorded
from orchestrator.control.state import State
from orchestrator.control.table import RunTable
from orchestrator.control.target import reached_in_files
from orchestrator.control.trials import Trials
from orchestrator.control.verdicts import Verdicts
from orchestrator.control.views import Progress, RunView, usd, with_places
from orchestrator.errors import OrchError
from orchestrator.store import layout
from orchestrator.store import lifecycle as life
from orchestrator.store.base import Store, get_json, put_json
from orchestrator.store.status import CORRUPT, QUEUED, RUNNING
from orchestrator.sweep import record as sweep_record
from orchestrator.sweep.spec import Sweep
from orchestrator.wait import retry_until

log = logging.getLogger("orch.controller")


# On a store that bills each request (S3), what a pass reads besides what changed:
REREAD_S = 30.0  # a followed run's record at least this often (its newest metrics line for the live table)
TOUCHED_S = 10.0  # `orch cancel`'s markers this often (a cancel also stops the run's host, which a pass sees at once)
SWEEP_CHECK_S = 60.0  # the sweep's own record (gone: the store was emptied under the controller)


class Controller(Verdicts):
    """The reconcile loop (see the module doc); the verdicts it writes are Verdicts' (verdicts.py)."""

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
        self.on_notify_wait: Callable[[int], None] | None = None  # told when a receiver keeps the loop's end waiting
        self.launched_at: float | None = None  # the sweep's first launch (`deadline:` durations count from it)
        self._moved: set[tuple[str, int]] = set()  # `deadline:`: (run, attempt) told to move to on-demand
        self._to_on_demand: dict[str, int] = {}  # run -> the attempt told to move: its next claim is on-demand
        self.ended = EndedHosts(backend, state, self.name)  # hosts that outlive their final run (ended.py)

    def prepare(self) -> bool:
        """Record the sweep in the store; refuse if a different sweep of that name is already there.

        Returns True when the sweep is new.
        """
        existing = check_recorded(self.sweep, self.store, self.state)
        with_code = code.settle(self.sweep, self.store, existing)  # the code the runs get, recorded or taken now
        if with_code is not None:
            put_json(self.store, layout.sweep_key(self.name), with_code)
            existing = with_code
        if existing is not None:  # a raised budget or max_restarts: what the old ones ended is run again
            raised.give_back(self.store, self.sweep, existing.get("spec") or {})
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
        self._hosts_seen = {rid: host_key(h) for rid, h in hosts.items()}
        if marked:
            summary.untouch(self.store, self.name, marked)
        rows = [self._row(rid, hosts.get(rid), now) for rid in tracked]
        self.backend.learn({rid: table.status[rid] for rid in tracked})  # aws: work rates per instance type
        budget = self.sweep.spec.budget_usd
        spend = self.backend.spend()
        for row in rows:
            if row.action == REPLACE:
                rid = row.run.run_id
                self._replace(row, hosts[rid], [h for h in every if h.run_id == rid])
            elif self.rungs is not None:
                self._rung(row, self.rungs)
        self._release_unclaimed(every, table.status)
        self.ended.check(every, table.status, table.final, now)
        timely = self._schedule(set(hosts), now)  # `deadline:`: which waiting runs the backend buys on-demand
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
        with_places(views, self.backend.places())
        progress = Progress(
            sweep=self.name,
            runs=views,
            started=started,
            spend_usd=spend,
            budget_usd=budget,
            target=summary.target_of(self.sweep.spec.target),
            deadline=timely,
        )
        self._publish(progress, now)
        if self.notifier is not None:
            self.notifier.observe(progress, facts_of(self.sweep, self.store, self.trials, progress))
        return progress

    def _schedule(self, hosted: set[str], now: float) -> DeadlineView | None:
        """`deadline:` — this pass's schedule (control/deadline.py), told to the backend: None without a deadline."""
        if not self.sweep.spec.deadline:
            return None
        if self.launched_at is None:
            found = get_json(self.store, layout.sweep_key(self.name)) or {}
            at = found.get("launched_at") if isinstance(found, dict) else None
            self.launched_at = float(at) if isinstance(at, (int, float)) else now
        at = deadline_moment(self.sweep.spec, self.launched_at)
        markets = self.backend.markets()
        views = self.table.all_views()
        switch, scale = self.backend.switch_s(), self.backend.work_scale()
        plan, view = schedule(self.sweep.spec, at or now, views, hosted, markets, switch, now, scale)
        final = {v.run_id for v in views if v.final}
        self._to_on_demand = {  # until its next attempt is claimed: once its checkpoint is taken (no work lost), the
            rid: att  # plan may no longer count it due, and it would wait for spot again
            for rid, att in self._to_on_demand.items()
            if (st := self.table.status.get(rid)) is not None and st.attempt == att and rid not in final
        }
        self.backend.buy_on_demand(plan.on_demand | plan.move | frozenset(self._to_on_demand))
        if plan.on_demand:
            log.info("deadline: %s on on-demand (%s)", ", ".join(sorted(plan.on_demand)), view.line(now))
        back = sorted(plan.back) if plan.back and self.backend.spot_there() else []  # else it would wait for spot
        for rid, where in [(r, "to on-demand") for r in sorted(plan.move)] + [(r, "back to spot") for r in back]:
            self._move(rid, where, view.line(now))  # it checkpoints (as on a spot notice); its next host is there
        return view

    def _move(self, rid: str, where: str, why: str) -> None:
        """`deadline:` — a run's agent told to checkpoint and end its attempt, once per attempt (schedule.py)."""
        status = self.table.status.get(rid)
        if status is None or status.state != RUNNING or (rid, status.attempt) in self._moved:
            return  # its agent has not started (a notice before it would be lost), or it was told already
        attempt = status.attempt
        try:
            told = self.backend.notify_interruption(rid)  # False: no host listed yet (still being bought)
        except Exception as exc:  # its host may be going: the next pass sees it
            log.warning("deadline: could not tell %s to move: %s", rid, exc)
            return
        if told:
            self._moved.add((rid, attempt))
            if where == "to on-demand":
                self._to_on_demand[rid] = attempt
            log.info("deadline: moving %s %s (%s)", rid, where, why)

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
            or host_key(host) != self._hosts_seen.get(rid)
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

    def _publish(self, progress: Progress, now: float) -> None:
        """The summary record, when something changed (and now and then while runs are active)."""
        key = (self.table.changed, round(progress.spend_usd, 4))
        if key == (False, self._published[0]) and (progress.done or now - self._published[1] < summary.REFRESH_S):
            return
        summary.write(self.store, progress)
        self.table.changed = False
        self._published = (round(progress.spend_usd, 4), now)

    def _stop_for_budget(self, rows, spend: float, budget: float) -> None:
        """The budget is spent: what has not started never will (running attempts finish)."""

        def cancel(row: Row) -> None:
            reason = f"{raised.BUDGET_STOP} {usd(budget)} reached (spent {usd(spend)})"
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

    def _tell_trials(self) -> None:
        if self.trials is not None:
            self.trials.tell_finished(self.table.views, self.rungs.values if self.rungs else None)

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

        if self.lease is not None and self.lease.took_over is not None:
            self.backend.took_over()
        self.notifier = notify.for_sweep(self.store, self.sweep)
        try:
            retry_until(one_pass, timeout=None, interval=interval)
            self.ended.wait(self.table.status, self.table.final)  # (ended.py)
            last[0].spend_usd = self.backend.spend()  # with what the hosts the wait still saw cost
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
        left = self.notifier.close(self.notify_patience_s, self.on_notify_wait, hand_off=self.notify_hand_off)
        if left and self.notify_hand_off:
            log.info("notify: %d message(s) still pending; a background sender keeps trying", left)
            notify.hand_off(str(self.sweep.path))
        elif left:
            log.warning("notify: %d message(s) could not be delivered before the controller ended", left)
