"""A run whose attempt spans several hosts (`resources: nodes:` on aws): what the agents of its
nodes say to each other, all through the store.

Node 0's agent is the attempt's one reporter: it writes the record, syncs the run folder and
takes the checkpoint on a notice, as for a one-host run. The other nodes' agents *follow*: they
restore the run folder (every rank resumes from the same checkpoint), run their copy of the
command, write no record, and watch node 0's: once it is no longer this attempt's or no longer
running (ended, interrupted, called lost), they stop their command and let their host go. A spot
notice on a follower is relayed to node 0 (a key in the store): node 0 checkpoints through the
notice path and the whole attempt ends, so the run resumes on a fresh set of nodes.

Runs on the host (the agent imports it): standard library only.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from orchestrator.store.base import Store
from orchestrator.store.layout import node_exit_key
from orchestrator.store.status import (
    CORRUPT,
    RUNNING,
    STARTING,
    RunStatus,
    read_status,
)
from orchestrator.wait import Timeout, retry_until

log = logging.getLogger("orch.agent")


def failed_node(store: Store, sweep: str, run_id: str, attempt: int, nodes: int) -> tuple | None:
    """(node, exit code) of the first follower of this attempt whose command failed, or None."""
    for node in range(1, nodes):
        try:
            data = store.get_bytes(node_exit_key(sweep, run_id, attempt, node))
        except Exception as exc:  # the store briefly unreachable: asked again at the next poll
            log.warning("reading node %s's exit: %s", node, exc)
            continue
        if data is not None:
            try:
                return node, int(data.decode().strip())
            except ValueError:
                return node, 1  # a follower said it failed, in words we cannot read: still a failure
    return None


class FollowerReporter:
    """The Reporter's interface for a follower: reads node 0's record, never writes one.

    `superseded` becomes true once the record is another attempt's, or this attempt's but no
    longer starting or running: the agent then stops its command.
    """

    def __init__(self, store: Store, sweep: str, run_id: str, attempt: int):
        self.store, self.sweep, self.run_id, self.attempt = store, sweep, run_id, attempt
        self.lock = threading.RLock()
        self.superseded = False

    def count(self, up: int = 0, down: int = 0) -> None:
        """A follower writes no record: the bytes it moves (its log, its `data:` staging) are not counted."""

    def _look(self) -> bool:
        current = read_status(self.store, self.sweep, self.run_id)
        if current.state == CORRUPT:  # no verdict can be read in it: node 0's agent writes it over at its next beat
            return not self.superseded
        if current.attempt != self.attempt or current.state not in (STARTING, RUNNING):
            if not self.superseded:
                log.info(
                    "node 0's record of %s says %s (attempt %s): this node's part of attempt %s ends",
                    self.run_id,
                    current.state,
                    current.attempt,
                    self.attempt,
                )
            self.superseded = True
        return not self.superseded

    def still_running(self) -> bool:
        """Node 0's record still says this attempt starts or runs."""
        return not self.superseded and self._look()

    def record(self, status: RunStatus, tries: int = 20) -> bool:
        return self.still_running()

    def beat(self, status: RunStatus, now: float | None = None) -> None:
        self._look()

    def heartbeats(self, current: Callable[[], RunStatus], period: float):
        from orchestrator.host.reporter import Heartbeats

        return Heartbeats(lambda: self.beat(current()), period)


class Relay:
    """A follower's notice, passed on to node 0 once."""

    def __init__(self, store: Store, key: str):
        self.store, self.key = store, key
        self.sent_at: float | None = None

    def send(self, node: int) -> None:
        if self.sent_at is None:
            self.store.put_bytes(self.key, f"spot notice on node {node} at {time.time():.0f}\n".encode())
            self.sent_at = time.time()
            log.info(
                "spot interruption notice on this node (%s): passed to node 0, which checkpoints for the run", node
            )

    def received(self) -> bool:
        try:
            return self.store.get_bytes(self.key) is not None
        except Exception as exc:  # the store briefly unreachable: asked again at the next poll
            log.warning("reading %s: %s", self.key, exc)
            return False


FOLLOWER_WAIT_S = 300.0  # a follower whose command ended waits this long for node 0's verdict


def await_node0(reporter, attempt: int) -> None:
    """A follower whose command ended stays until node 0 has recorded how the attempt ended: a
    node gone first would make the controller call the attempt lost (and try again) where node 0
    is about to record a failure. (Node 0, whose reporter is no FollowerReporter, records the end itself.)"""
    if not isinstance(reporter, FollowerReporter):
        return
    try:
        retry_until(
            lambda: not reporter.still_running(), FOLLOWER_WAIT_S, 2.0, "node 0 to record the end of the attempt"
        )
    except Timeout:
        log.warning(
            "node 0 has not recorded the end of attempt %s after %.0f s; leaving anyway", attempt, FOLLOWER_WAIT_S
        )
