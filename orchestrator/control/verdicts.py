"""What a pass writes: each verdict (a host lost, a run pruned, given up, its record unreadable, an outcome the
backend reported, a host of an older attempt released), written only over the record the pass read (`_write`), then
shown in the run table. The Controller (controller.py) is a Verdicts: the loop decides, these write.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

from orchestrator.backends.base import Backend, Host
from orchestrator.control.decide import MAX_NO_SHOWS, START, Row
from orchestrator.control.prune import Rungs, Verdict
from orchestrator.control.state import State
from orchestrator.control.table import RunTable
from orchestrator.control.target import reached_in_files
from orchestrator.control.views import RunView, view_of
from orchestrator.store import layout
from orchestrator.store import lifecycle as life
from orchestrator.store.base import Store, read_jsonl
from orchestrator.store.lifecycle import StopReason
from orchestrator.store.status import (
    ACTIVE,
    CORRUPT,
    QUEUED,
    RunStatus,
    update_status,
    write_if,
)
from orchestrator.sweep.spec import Sweep

log = logging.getLogger("orch.controller")


class Verdicts:
    """The verdict-writing half of the Controller: it reads and writes the attributes the Controller sets."""

    sweep: Sweep
    backend: Backend
    store: Store
    state: State
    name: str
    table: RunTable
    reached: set
    _warned: set

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
        if host.missing and beat:  # the nodes left are alive: stopped as orch stops a run, they sync what they wrote
            self.backend.stop(status.run_id, StopReason.LOST)
        for h in all_hosts or [host]:
            self.backend.release(h)
        self.state.journal(self.name, "replace", status.run_id, reason)

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
