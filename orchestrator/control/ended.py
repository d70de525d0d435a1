"""Hosts that outlive their run. An agent records how its command ended (its results synced before that record),
then ends its host: an instance terminates itself, a session or job exits. One that dies in between, or cannot end
it, leaves a host that nothing on it will end: on AWS an instance that bills until the safety net's shutdown, hours
later. The controller gives each such host ENDED_HOST_S from the pass that first saw it beside its ended run, then
releases it itself; at the loop's end it waits for the last ones, so `orch launch` returns once no host of a run
whose agent recorded its end still runs.

Only runs whose agent recorded the end (succeeded, or failed with the command's exit code) count. A run the
controller ended (`orch cancel`, `prune:`, the budget) has an agent that may still be syncing its results for up to
agent.py's FINAL_SYNC_S, and ends its host after that. Hosts that stay by design (`aws.keep_alive`: for `orch
attach`, until nobody was attached for a while) are left alone.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from orchestrator.backends.base import ACQUIRING, Backend, Host
from orchestrator.control.state import State
from orchestrator.errors import OrchError
from orchestrator.store.lifecycle import RunState, RunStatus
from orchestrator.wait import Timeout, retry_until

log = logging.getLogger("orch.controller")

# An agent ends its host within a second or two of recording the end (its results were synced before the record);
# this is a dead or stuck agent's margin, not a wait the normal path pays.
ENDED_HOST_S = 60.0
END_POLL_S = 2.0  # how often the loop's end looks for the last hosts


@dataclass
class EndedHosts:
    backend: Backend
    state: State
    sweep: str
    grace_s: float = ENDED_HOST_S
    poll_s: float = END_POLL_S  # at the loop's end
    first_seen: dict[tuple[str, str], float] = field(default_factory=dict)  # (run, host id) -> first seen ended
    released: set[tuple[str, str]] = field(default_factory=set)

    def check(self, hosts: list[Host], statuses: dict[str, RunStatus], final: set[str], now: float) -> int:
        """Release the hosts of runs their agent ended that were seen for grace_s; returns how many such hosts are
        still listed (released ones included until they are gone)."""
        if self.backend.hosts_outlive_runs:
            return 0
        left = [
            h
            for h in hosts
            if h.run_id in final and h.host_id != ACQUIRING and not h.provisioning and _agent_ended(statuses, h.run_id)
        ]
        keys = {(h.run_id, h.host_id) for h in left}
        self.first_seen = {k: t for k, t in self.first_seen.items() if k in keys}
        for host in left:
            key = (host.run_id, host.host_id)
            first = self.first_seen.setdefault(key, now)
            if now - first < self.grace_s or key in self.released:
                continue
            log.warning(
                "%s: its run ended %.0f s ago and host %s is still there (its agent did not end it); releasing it",
                host.run_id,
                now - first,
                host.host_id,
            )
            try:
                self.backend.release(host)
            except Exception as exc:  # a backend's own error (ssh, EC2, Slurm): the next pass tries again
                log.warning("%s: could not release host %s: %s", host.run_id, host.host_id, exc)
                continue
            self.released.add(key)
            self.state.journal(self.sweep, "release-ended", host.run_id, host.host_id)
        return len(left)

    def wait(self, statuses: dict[str, RunStatus], final: set[str]) -> None:
        """Every run is final (no pass changes these any more): wait until no host of a run its agent ended is
        listed, releasing the ones there grace_s from now (the wall clock's: a pass's `now` may be another's). One
        still listed after grace_s and a few polls more is logged: `orch down` ends it."""
        if self.backend.hosts_outlive_runs:
            return
        self.first_seen.clear()
        try:
            retry_until(
                lambda: self.check(self.backend.list(), statuses, final, time.time()) == 0,
                self.grace_s + 10 * self.poll_s,
                self.poll_s,
                "the ended runs' hosts to end",
            )
        except Timeout:
            log.warning("hosts of ended runs are still listed; `orch down %s` ends them", self.sweep)
        except (OrchError, OSError) as exc:  # the backend cannot list them now: the next launch or `orch down` can
            log.warning("could not check that the ended runs' hosts ended: %s", exc)


def _agent_ended(statuses: dict[str, RunStatus], run_id: str) -> bool:
    """The run's record says its agent recorded how the command ended: nothing is left for its host to do."""
    status = statuses.get(run_id)
    return status is not None and status.state in (RunState.SUCCEEDED, RunState.FAILED) and status.exit_code is not None
