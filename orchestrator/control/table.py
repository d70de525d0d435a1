"""The controller's run table: the last-read record of every run, in memory, so a pass reads only what may change.

A final run (succeeded, cancelled, pruned, failed for good) is never read again. A queued run is not
read until the controller is about to claim it (the claim is conditional, so a record changed
meanwhile, e.g. by `orch cancel`, shows up as a refused write and is read then). Everything else —
starting, running, interrupted, lost, stopped, failed with restarts left — is followed every pass; on a
store that bills each request (S3) a pass reads of those only what may have changed or what it is about
to act on (controller.py, Controller._due).
The first pass starts from the summary record when there is one (its final and queued rows are
trusted, see summary.py), else it lists which records exist (one LIST per 1,000 keys) and reads
those, in parallel: a new sweep of 10,000 runs starts after one LIST, not 10,000 reads of nothing.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

from orchestrator.control.views import RunView
from orchestrator.store.base import Store
from orchestrator.store.status import QUEUED, RunStatus, read_versioned, recorded_runs
from orchestrator.sweep.spec import Sweep

READERS = 10  # parallel record reads (S3 answers each in tens of milliseconds); botocore keeps 10 connections a client
SEQUENTIAL = 64  # fewer records than this are read one after the other


def read_many(store: Store, sweep: str, run_ids: list[str]) -> dict[str, tuple]:
    """{run_id: (status, version)}, read in parallel when there are several."""
    if len(run_ids) <= SEQUENTIAL:  # a pass's few live runs: one kept-alive connection costs less CPU than threads
        return {rid: read_versioned(store, sweep, rid) for rid in run_ids}
    with ThreadPoolExecutor(max_workers=min(READERS, len(run_ids))) as pool:
        return dict(zip(run_ids, pool.map(lambda rid: read_versioned(store, sweep, rid), run_ids)))


class RunTable:
    def __init__(self, sweep: Sweep, store: Store):
        self.sweep, self.store, self.name = sweep, store, sweep.spec.name
        self.runs = {run.run_id: run for run in sweep.runs}
        self.order = [run.run_id for run in sweep.runs]
        self.index = {rid: i for i, rid in enumerate(self.order)}
        self.status: dict[str, RunStatus] = {}  # the records read (or written) by this controller
        self.versions: dict[str, str | None] = {}
        self.views: dict[str, RunView] = {rid: _queued(rid) for rid in self.order}
        self.final: set[str] = set()
        self.watch: set[str] = set()  # read every pass
        self.fresh: set[str] = set()  # read by load() in this very pass
        self.queue: deque[str] = deque()  # presumed queued: read only when about to be claimed, in this order
        self.loaded = False
        self.changed = True  # a view changed since the summary was last written
        self.reads = 0  # records read, in all (the scale benchmark reports it)
        self.read_at: dict[str, float] = {}  # when a pass last read each followed run's record

    def load(self, summary: dict[str, RunView] | None) -> None:
        """Before the first pass: trust a summary's final and queued rows and read the rest this pass;
        without a summary, read every record now."""
        self.loaded = True
        if summary is None:
            # a record missing now may be written before its claim (a second controller): the claim is
            # conditional on the key's absence, so that shows as a refused write and is read then
            present = recorded_runs(self.store, self.name)
            records = read_many(self.store, self.name, [rid for rid in self.order if rid in present])
            self.update(records)
            self.fresh = set(records)  # read just now: the first pass decides them without reading again
            for rid in self.order:
                status = records[rid][0] if rid in records else None
                unclaimed = status is None or (status.state == QUEUED and status.attempt == 0)
                (self.queue.append if unclaimed else self.watch.add)(rid)
            return
        for rid in self.order:
            row = summary[rid]
            if row.final:
                self.views[rid] = row
                self.final.add(rid)
            elif row.state == QUEUED:
                self.queue.append(rid)
            else:
                self.watch.add(rid)

    def update(self, records: dict[str, tuple]) -> None:
        self.reads += len(records)
        for rid, (status, version) in records.items():
            self.status[rid], self.versions[rid] = status, version

    def follow(self, run_ids: Iterable[str]) -> None:
        """Read these runs every pass from now on (a host of theirs is up, or someone touched their record)."""
        for rid in run_ids:
            if rid in self.runs:
                self.final.discard(rid)
                self.watch.add(rid)

    def read_tracked(self, due: Callable[[str], bool] | None = None, now: float = 0.0) -> list[str]:
        """Read the runs followed every pass (of them, with `due`, only those it names; the others keep the
        record read before); returns them all in grid order."""
        tracked = sorted(self.watch, key=self.index.__getitem__)
        todo = [rid for rid in tracked if rid not in self.fresh and (due is None or rid not in self.status or due(rid))]
        self.update(read_many(self.store, self.name, todo))
        self.read_at.update(dict.fromkeys(todo, now))
        self.fresh = set()
        return tracked

    def take_queued(self) -> str | None:
        """The next run waiting in the queue, read now (it is about to be claimed), or None."""
        while self.queue:
            rid = self.queue.popleft()
            if rid in self.final or rid in self.watch:
                continue
            self.update(read_many(self.store, self.name, [rid]))
            self.watch.add(rid)
            return rid
        return None

    def settle(self, run_id: str, view: RunView, final: bool) -> None:
        view.final = final
        if _key(self.views[run_id]) != _key(view):
            self.changed = True
        self.views[run_id] = view
        if final:
            self.final.add(run_id)
            self.watch.discard(run_id)

    def all_views(self) -> list[RunView]:
        return [self.views[rid] for rid in self.order]


def _key(v: RunView) -> tuple:
    return (v.state, v.attempt, v.failures, v.preemptions, v.exit_code, v.final, v.reason, v.reached)


def _queued(run_id: str) -> RunView:
    return RunView(run_id=run_id, state=QUEUED, attempt=0, failures=0, preemptions=0, elapsed=None, metrics={})
