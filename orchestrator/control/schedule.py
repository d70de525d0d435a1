"""`deadline:`: which runs must be bought on-demand now for every run to end before the deadline (pure; the controller
asks each pass, the dry run once). docs/guides/deadline.md says it in words.

The rule is Can't Be Late's Uniform Progress (Wu et al., NSDI'24) for a sweep: spot while the work left still fits
before the deadline if it all went on-demand from now, on-demand once waiting longer would make it late.

- Each run not final has `left_s` of work (seconds of its own clock): the longest a finished run of the sweep took,
  less what it has done; before any run finished, `timeout_minutes` (the most a run may take: an upper bound).
- A run that must move to a new instance (a boot and a restore) needs `switch_s` more; one running on on-demand
  does not, and a run on spot is counted as if it had to move (spot may take it back).
- *All on-demand from t*: the runs that hold a host keep their slot (of `max_parallel`) until they end; the waiting
  runs each take the slot that frees first, from t on, in the order the controller starts them — a run that has
  made progress (retried, reclaimed) before one that has not, so the shortest first (the benchmark missed
  deadlines when this assumed longest first: a reclaimed run took the slot the plan kept for a longer one). The
  last must end before the deadline less one more `switch_s` (the margin: a reclaim at the last moment).
- The *switch moment* is the latest t for which that still holds. Before it, waiting runs take spot when there is
  some (or wait); from it on, every waiting run that gets a slot is bought on-demand — the fewest runs, from the
  moment they must.
- A run on spot is moved to on-demand (it checkpoints, as on a spot notice, and its next host is on-demand) when a
  reclaim of it now — `loss_s` of its work lost (default: `switch_s`) and a move — would leave the sweep behind:
  the benchmark missed deadlines without these moves. The MOVE_CHECKS runs with most work left are asked.
- A run on on-demand goes back to spot (the same notice; its next host is bought as `aws.market` says) when the
  sweep would still be a move ahead of its switch moment with that run waiting again, and its work left is worth
  BACK_MIN_SWITCHES moves; one a pass, the one with most work left. Each pass starts over from the records.
- Behind: the switch moment has passed. The deadline cannot be met when, even all on-demand from now with nothing
  reclaimed, the last run would end after it (the shortfall says by how much).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

PASS_SLACK_S = 10.0  # a switch moment before the next passes is now
SEARCH_STEPS = 20  # bisection steps for the switch moment (the window / 2**20: a second for 12 days)
BACK_MIN_SWITCHES = 3  # a run on on-demand goes back to spot only with at least this many moves' work left
MOVE_CHECKS = 8  # runs on spot asked "would a reclaim now make the sweep late?" each pass: those with most work left


@dataclass(frozen=True)
class RunWork:
    """One run not final, as the schedule sees it."""

    run_id: str
    left_s: float  # work left, seconds
    hosted: bool = False  # it runs now (or its host is on its way)
    on_demand: bool = False  # ... on an on-demand instance


@dataclass(frozen=True)
class Schedule:
    """What the deadline asks of this pass."""

    deadline: float  # seconds since the epoch
    now: float
    work_left_s: float  # the runs' work left, summed
    switch_at: float | None  # the latest moment the waiting runs may still wait on spot (None: none waits)
    on_demand: frozenset[str] = frozenset()  # runs waiting for a host that must get an on-demand one now
    move: frozenset[str] = frozenset()  # runs on spot that a reclaim now would make late: moved to on-demand
    back: frozenset[str] = frozenset()  # a run on on-demand the sweep is far enough ahead to move back to spot
    behind_s: float = 0.0  # how long the switch moment has passed (0: on schedule)
    shortfall_s: float = 0.0  # > 0: even all on-demand from now, the last run ends this long after the deadline

    @property
    def on_schedule(self) -> bool:
        return self.behind_s <= 0 and self.shortfall_s <= 0


def finish(runs: list[RunWork], slots: int, now: float, switch_s: float, start: float, keep: bool = False) -> float:
    """When the last run ends if every waiting run goes on-demand from `start` (module doc). `keep`: runs on spot
    keep running as they are (no reclaim), for the shortfall."""

    def needs(r: RunWork) -> float:
        return r.left_s + (0.0 if r.on_demand or (keep and r.hosted) else switch_s)

    n = max(1, slots)
    ends = sorted(now + needs(r) for r in runs if r.hosted)  # (more than n after a relaunch lowered max_parallel:
    free = ends[len(ends) - n :] if len(ends) >= n else ends + [now] * (n - len(ends))  # a slot frees as they end)
    heapq.heapify(free)
    last = max(ends + free, default=now)
    for r in sorted((r for r in runs if not r.hosted), key=lambda r: (needs(r), r.run_id)):
        end = max(heapq.heappop(free), start) + needs(r)
        heapq.heappush(free, end)
        last = max(last, end)
    return last


def switch_moment(runs: list[RunWork], slots: int, now: float, switch_s: float, end: float) -> float | None:
    """The latest start from which all on-demand still ends by `end` (None: nothing waits); `now` less how far
    behind when even starting now is too late."""
    if not any(not r.hosted for r in runs):
        return None
    late = finish(runs, slots, now, switch_s, now) - end
    if late > 0:
        return now - late
    lo, hi = now, max(now, end)
    for _ in range(SEARCH_STEPS):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if finish(runs, slots, now, switch_s, mid) <= end else (lo, mid)
    return lo


def plan(
    runs: list[RunWork], slots: int, deadline: float, now: float, switch_s: float, loss_s: float | None = None
) -> Schedule:
    """This pass's schedule (module doc)."""
    end = deadline - switch_s  # the margin: one move more, for a reclaim at the last moment
    loss = switch_s if loss_s is None else loss_s
    at = switch_moment(runs, slots, now, switch_s, end)
    due = at is not None and at <= now + PASS_SLACK_S
    waiting = frozenset(r.run_id for r in runs if not r.hosted)
    on_spot = sorted((r for r in runs if r.hosted and not r.on_demand), key=lambda r: (-r.left_s, r.run_id))
    shortfall = max(0.0, finish(runs, slots, now, switch_s, now, keep=True) - deadline)
    move = frozenset(  # (none once the deadline is out of reach: a move would only make the runs later)
        r.run_id
        for r in (on_spot[:MOVE_CHECKS] if shortfall <= 0 else [])
        if _late_if_reclaimed(r, runs, slots, now, switch_s, end, loss)
    )
    return Schedule(
        deadline=deadline,
        now=now,
        work_left_s=sum(r.left_s for r in runs),
        switch_at=at,
        on_demand=waiting if due else frozenset(),
        move=move,
        back=frozenset() if due or move else _back_to_spot(runs, slots, now, switch_s, end),
        behind_s=max(0.0, now - at) if at is not None else 0.0,
        shortfall_s=shortfall,
    )


def _back_to_spot(runs: list[RunWork], slots: int, now: float, switch_s: float, end: float) -> frozenset[str]:
    """The run on on-demand with most work left, when the sweep stays a move ahead of its switch moment with that run
    waiting for spot again (and its work left is worth a move: BACK_MIN_SWITCHES of them); at most one a pass."""
    on_demand = sorted((r for r in runs if r.hosted and r.on_demand), key=lambda r: (-r.left_s, r.run_id))
    for r in on_demand[:1]:
        if r.left_s < BACK_MIN_SWITCHES * switch_s:
            continue
        waiting = [RunWork(x.run_id, x.left_s) if x is r else x for x in runs]
        at = switch_moment(waiting, slots, now, switch_s, end)
        if at is not None and at >= now + PASS_SLACK_S + switch_s:
            return frozenset({r.run_id})
    return frozenset()


def _late_if_reclaimed(
    r: RunWork, runs: list[RunWork], slots: int, now: float, switch_s: float, end: float, loss_s: float
) -> bool:
    """Whether a reclaim of `r` now (it waits for a host again, `loss_s` of its work lost) would leave the sweep
    behind by the next pass."""
    at = switch_moment([_reclaimed(x, r, loss_s) for x in runs], slots, now, switch_s, end)
    return at is not None and at < now + PASS_SLACK_S


def _reclaimed(run: RunWork, taken: RunWork, loss_s: float) -> RunWork:
    """`run` as the schedule would see it if spot took `taken` back now (it waits for a host again)."""
    return RunWork(run.run_id, run.left_s + loss_s, hosted=False) if run is taken else run


def run_length(finished_s: list[float], timeout_s: float) -> tuple[float, str]:
    """How long one run takes, and how that is known: the longest finished run of the sweep, else its timeout."""
    if finished_s:
        return max(finished_s), f"measured: the longest of {len(finished_s)} finished run(s)"
    return timeout_s, "assumed: timeout_minutes, until a run of the sweep finished"
