"""What a run needs now: `decide()`, a pure function of its record and its host as listed (tested alone, like the
host's final_status), and the live hosts of a pass as one backend call lists them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum

from orchestrator.backends.base import Backend, Host
from orchestrator.control.views import RunView
from orchestrator.store import lifecycle as life
from orchestrator.store.status import (
    ACTIVE,
    CANCELLED,
    CORRUPT,
    FAILED,
    PRUNED,
    STARTING,
    SUCCEEDED,
    RunStatus,
)
from orchestrator.sweep.spec import RunSpec


class Action(str, Enum):
    """What a run needs now (decide()'s answer)."""

    WAIT = "wait"  # it runs, or must not run again yet
    START = "start"  # a new attempt may start
    DONE = "done"  # final: never read again
    REPLACE = "replace"  # its host is lost: the verdict, then the host goes


WAIT, START, DONE, REPLACE = Action.WAIT, Action.START, Action.DONE, Action.REPLACE
MAX_NO_SHOWS = 3  # attempts whose host never reported before the run fails for good


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


def host_key(host: Host) -> tuple:
    """What of a listed host means its run may have changed (not its liveness time, which moves every beat)."""
    return (host.host_id, host.attempt, host.provisioning, host.missing, host.node, host.slot, host.mark)
