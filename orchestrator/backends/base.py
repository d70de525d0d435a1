"""The backend interface: typed stubs and the plain dataclasses that cross it."""

from __future__ import annotations

import builtins
from dataclasses import dataclass
from typing import Protocol

from orchestrator.contract import RunTask
from orchestrator.store.lifecycle import RunState, RunStatus, StopReason

ACQUIRING = "(acquiring)"  # host_id of a run whose host is still being acquired


@dataclass(frozen=True)
class Host:
    """A live host running one run's agent."""

    run_id: str  # the run it serves
    host_id: str  # tmux session name (local), instance id (aws), or ACQUIRING
    address: str  # where to reach it ("localhost" or an IP)
    attempt: int | None = None  # the attempt it was started for, when the backend knows
    provisioning: bool = False  # this controller is still setting it up (acquire, boot, ssh, agent)
    start_deadline: float | None = None  # its agent must have reported by then, or the host is replaced
    node: int = 0  # its node rank in a run that spans several hosts
    nodes: int = 1  # hosts the attempt spans
    missing: int = 0  # (set by the controller's survey) nodes of this attempt that are gone
    slot: int = (
        -1
    )  # packing: the run's slot on an instance shared with other runs (-1: the instance is the run's alone)
    # Seen without a store request, where the backend can (local: a file the agent keeps in its control folder):
    seen: float | None = None  # when its agent last showed it is alive (counts as a heartbeat)
    # changes whenever its agent writes what a pass must read (local: every record; aws: a rung's value, by tag)
    mark: str | None = None


@dataclass(frozen=True)
class Outcome:
    """What became of an attempt before its agent ran (no capacity, or provisioning failed), for the controller to
    record."""

    run_id: str
    attempt: int  # the attempt it is about
    state: (
        RunState  # QUEUED: no host for it now (not counted); FAILED: provisioning failed (counts against max_restarts)
    )
    reason: str  # in words, for the run's status


class Backend(Protocol):
    """What the controller needs from a place that runs commands: every method and attribute it uses.

    The controller never probes a backend (no getattr, no name tests); BackendBase gives defaults.
    """

    name: str
    poll_s: float  # seconds between controller passes
    stale_s: float  # a running agent silent this long has lost its host
    start_timeout_s: float  # a started agent must report within this (unless its Host says when)
    releases_interrupted_host: bool  # after a chaos notice, take the host away (a local agent ends its own session)

    @property
    def hosts_outlive_runs(self) -> bool:
        """A host may stay after its run ended (aws.keep_alive): its end shows only in the record. Read-only: a
        backend may answer it from its settings."""
        ...

    def list(self) -> builtins.list[Host]:
        """Live hosts of this sweep (one call, whatever the number of runs)."""
        ...

    def new_task(self, run_id: str, attempt: int, command: str, params_json: str, replaces: str = "") -> RunTask:
        """The task for one attempt of a run on this backend (paths, environment, periods), whole: nothing changes
        it after; `replaces`: the host of the previous attempt when that one was preempted or lost."""
        ...

    def start(self, task: RunTask) -> Host:
        """Start the agent for task; raises OrchError when the run already has a live host."""
        ...

    def release(self, host: Host) -> None:
        """Get rid of a host at once (lost, or serving no current attempt); no grace."""
        ...

    def stop(self, run_id: str, reason: StopReason) -> bool:
        """Ask the run's agent to stop its command (it records the state `reason` ends in) and wait; False if none
        ran."""
        ...

    def notify_interruption(self, run_id: str) -> bool:
        """Deliver a spot notice the way the agent looks for one; False when the run has no live host."""
        ...

    def attach(self, run_id: str, node: int = 0) -> int:
        """Give this terminal to the run's tmux window on its node `node` (exec or bridge); returns an exit code."""
        ...

    def preflight(self) -> None:
        """Fail early, with the next step, on what would make every start fail."""
        ...

    def plan(self) -> dict | None:
        """What a launch would ask for and cost (`--dry-run`); None when there is nothing to price."""
        ...

    def spend(self) -> float:
        """Dollars spent so far by the sweep."""
        ...

    def places(self) -> dict[str, dict[int, str]]:
        """run -> {attempt: where it ran} (aws: the region), for the launch's progress; {} where there is one place."""
        ...

    def run_of_instance(self, host_id: str) -> str | None:
        """The run a host id (e.g. an instance id) serves, if any."""
        ...

    def teardown(self) -> builtins.list[str]:
        """Remove the sweep's per-sweep resources (after its runs stopped); returns what went."""
        ...

    def flush(self) -> None:
        """Write to the store what the backend keeps in memory between writes (the cost ledger's newest times)."""
        ...

    def drain_outcomes(self) -> builtins.list[Outcome]:
        """Outcomes of attempts that ended before their agent ran, since the last call (the controller records them)."""
        ...

    def learn(self, statuses: dict[str, RunStatus]) -> None:
        """The records a pass just read (aws: each attempt's work rate, to weigh where the next one runs)."""
        ...

    def took_over(self) -> None:
        """This controller took the sweep over from one that died without handing it over: nothing will finish what
        that one was starting (before the first list())."""
        ...

    def buy_on_demand(self, runs: frozenset[str]) -> None:
        """`deadline:` — the runs whose next host must be on-demand whatever `market` says (control/schedule.py);
        each pass replaces the last pass's set. Only a backend that buys markets (aws) acts on it."""
        ...

    def markets(self) -> dict[str, str]:
        """run -> the market of the host it runs on now (spot, on-demand); {} where nothing is bought."""
        ...

    def switch_s(self) -> float | None:
        """The sweep's measured boot + restore of an attempt (seconds), None before one was measured."""
        ...

    def work_scale(self) -> dict[str, float]:
        """`deadline:` — run -> how much longer its work left would take on the slowest type it may be bought on next
        than on the type it ran on ("" : a run not started yet); {} where every host is alike or nothing is measured."""
        ...

    def spot_there(self) -> bool:
        """Whether spot is likely there now (a `deadline:` moves a run back to spot only then: else it would wait for
        spot and be bought on-demand again — a move wasted)."""
        ...


class BackendBase:
    """Defaults for the optional parts of the Backend interface."""

    poll_s = 1.0  # a pass a second: a pass reads only live runs, but back to back it would still spin a core
    stale_s = 60.0
    start_timeout_s = 60.0
    releases_interrupted_host = True
    hosts_outlive_runs = False

    def plan(self) -> dict | None:
        return None

    def spend(self) -> float:
        return 0.0

    def places(self) -> dict[str, dict[int, str]]:
        return {}

    def run_of_instance(self, host_id: str) -> str | None:
        return None

    def preflight(self) -> None:
        pass

    def teardown(self) -> list[str]:
        return []

    def flush(self) -> None:
        pass

    def drain_outcomes(self) -> list[Outcome]:
        return []

    def learn(self, statuses: dict[str, RunStatus]) -> None:
        pass

    def took_over(self) -> None:
        return None

    def buy_on_demand(self, runs: frozenset[str]) -> None:
        return None

    def markets(self) -> dict[str, str]:
        return {}

    def switch_s(self) -> float | None:
        return None

    def spot_there(self) -> bool:
        return True

    def work_scale(self) -> dict[str, float]:
        return {}
