"""A run whose attempt spans several hosts (`resources: nodes:` on aws): what the agents of its
nodes say to each other, all through the store.

Node 0's agent is the attempt's one reporter: it writes the record, syncs the run folder and
takes the checkpoint on a notice, as for a one-host run. The other nodes' agents *follow*: they
restore the run folder (every rank resumes from the same checkpoint), run their copy of the
command, write no record, and watch node 0's: once it is no longer this attempt's or no longer
running (ended, interrupted, called lost), they stop their command and let their host go. When node 0 ends
the attempt itself (its command exited, a node failed, a timeout), it first says so in the store; each
follower then stops its command, syncs its log and says it is done, and node 0 records the end only once
every follower is done (or FOLLOWERS_DONE_S passed): every node's log of a final attempt is in the store. A spot
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
from orchestrator.store.layout import node_done_key, node_end_key, node_exit_key
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
# node 0 waits this long for the followers' last syncs before it records the end: a follower sees the end within its
# notice poll (5 s on aws), its command gets watch.KILL_GRACE_S (10 s) to stop, its log one try of STOP_SYNC_S (8 s)
FOLLOWERS_DONE_S = 60.0


class NodesEnd:
    """Node 0 ends the attempt itself: it tells the followers (`announce`), then the end is recorded once each
    follower is done, its log synced (`done`)."""

    def __init__(self, store: Store, sweep: str, run_id: str, attempt: int, nodes: int):
        self.store, self.sweep, self.run_id, self.attempt = store, sweep, run_id, attempt
        self.waiting = set(range(1, nodes))

    def announce(self) -> bool:
        """False when the store refused (the end is then recorded without waiting)."""
        key = node_end_key(self.sweep, self.run_id, self.attempt)
        try:
            self.store.put_bytes(key, f"attempt {self.attempt} ends at {time.time():.0f}\n".encode())
            return True
        except Exception as exc:
            log.warning("could not tell the other nodes that the attempt ends (%s: %s)", type(exc).__name__, exc)
            return False

    def done(self) -> bool:
        """Every follower said it is done (each asked once a call; a store error asks again at the next)."""
        for node in sorted(self.waiting):
            try:
                if self.store.get_bytes(node_done_key(self.sweep, self.run_id, self.attempt, node)) is not None:
                    self.waiting.discard(node)
            except Exception as exc:
                log.warning("reading node %s's end: %s", node, exc)
        return not self.waiting


def end_attempt(store: Store, sweep: str, run_id: str, attempt: int, nodes: int, ours: Callable[[], bool]) -> None:
    """Node 0 ends the attempt: it tells the followers, then waits until each is done, the attempt is no longer
    `ours` (the controller moved on), or FOLLOWERS_DONE_S pass (a follower whose host went says nothing)."""
    end = NodesEnd(store, sweep, run_id, attempt, nodes)
    if not end.announce():
        return
    try:
        retry_until(lambda: end.done() or not ours(), FOLLOWERS_DONE_S, 1.0, "the other nodes to sync their logs")
    except Timeout:
        log.warning(
            "nodes %s did not sync their logs in %.0f s; recording the end", sorted(end.waiting), FOLLOWERS_DONE_S
        )


def attempt_ending(store: Store, sweep: str, run_id: str, attempt: int) -> bool:
    """A follower: node 0 said it ends the attempt."""
    return store.get_bytes(node_end_key(sweep, run_id, attempt)) is not None


def follower_done(store: Store, sweep: str, run_id: str, attempt: int, node: int) -> None:
    """A follower's last sync was tried: node 0 may record the end."""
    store.put_bytes(node_done_key(sweep, run_id, attempt, node), b"done\n")


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
