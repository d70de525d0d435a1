"""The agent's watch over a running command: small periodic checks, each with its interval and one job.

In the manner of SkyPilot's skylet events: a check runs when it is due, does one thing, and an error
in it is logged and tried again a little later, never the end of the watch. The watch polls every
check in order, every POLL_S; the first that says the attempt is over ends it. Order matters where
one check acts on what an earlier one decided (the stop requests come before the signals).

A check is given the agent (host/agent.py) it watches for: its files, its notices, its reporter.
"""

from __future__ import annotations

import logging
import signal
import time
from typing import Any

from orchestrator.host import tmux
from orchestrator.host.attempt import newest_checkpoint
from orchestrator.host.nodes import failed_node
from orchestrator.store.lifecycle import StopReason
from orchestrator.wait import retry_until

log = logging.getLogger("orch.agent")

POLL_S = 0.05  # how often the watch polls its checks (the command's exit is seen this fast)
ERROR_RETRY_S = 2.0  # a check that raised is tried again after this long at the soonest
WINDOW_LOOK_S = 2.0  # how often the agent looks for the command's tmux window
KILL_GRACE_S = 10.0  # SIGTERM -> SIGKILL
CHECKPOINT_LOOK_S = 1.0  # how often the agent looks for a newly completed checkpoint


class Check:
    """One periodic job. `interval` 0 runs at every poll; `first` is when it is first due (unix seconds)."""

    def __init__(self, agent: Any, interval: float = 0.0, first: float = 0.0):
        self.agent, self.interval, self.next_at, self.hold_until = agent, interval, first, 0.0

    @property
    def name(self) -> str:
        return type(self).__name__

    def urgent(self) -> bool:
        """Due at every poll, whatever its interval (something it started is under way)."""
        return False

    def tick(self, now: float) -> bool:
        """Run if due; True when the attempt's watch is over."""
        if now < self.hold_until or (now < self.next_at and not self.urgent()):
            return False
        if now >= self.next_at:
            self.next_at = now + self.interval
        try:
            return bool(self.run(now))
        except Exception as exc:  # one check's trouble (the store, IMDS) must not end the watch of the command
            self.hold_until = now + max(self.interval, ERROR_RETRY_S)
            log.warning("%s failed (%s: %s); trying again later", self.name, type(exc).__name__, exc)
            return False

    def run(self, now: float) -> bool | None:
        raise NotImplementedError


class CommandExited(Check):
    """The wrapper wrote the command's exit code: the attempt is over."""

    def run(self, now: float) -> bool:
        return self.agent.exit_file.exists()


class FindGroup(Check):
    """The command's process group, once its wrapper wrote it (to stop what it leaves behind)."""

    def run(self, now: float) -> None:
        if self.agent.cmd_group is None:
            self.agent.cmd_group = self.agent._group_of_command()


class WindowGone(Check):
    """A wrapper that died without an exit code (its window killed) ends the attempt too."""

    def run(self, now: float) -> bool:
        return not tmux.has_window(self.agent.task.session, "run") and not self.agent.exit_file.exists()


class RungPassed(Check):
    """`prune:` a metrics line at a rung is reported now, not at the next heartbeat."""

    def __init__(self, agent: Any, status: Any):
        super().__init__(agent)
        self.status = status

    def run(self, now: float) -> None:
        if self.agent.rungs.passed():
            self.agent.reporter.beat(self.status, now)


class Superseded(Check):
    """The controller moved on from this attempt (the reporter saw it): stop the command, write nothing."""

    def run(self, now: float) -> None:
        if self.agent.reporter.superseded:
            request_stop(self.agent, StopReason.SUPERSEDED)


class NodeFailed(Check):
    """Node 0 of a run on several hosts: a node's failure is the attempt's, so this node stops too."""

    def run(self, now: float) -> None:
        a, t = self.agent, self.agent.task
        if a.stop_requested:
            return
        a.node_failed = failed_node(a.store, t.sweep, t.run_id, t.attempt, t.node_hosts)
        if a.node_failed:
            log.info("node %s exited with code %s: the attempt ends", *a.node_failed)
            request_stop(a, StopReason.NODE_FAILED)


class SpotNotice(Check):
    """A spot interruption notice: checkpoint, sync, stop (the agent's _on_notice, polled every poll once seen)."""

    def __init__(self, agent: Any, status: Any, interval: float):
        super().__init__(agent, interval)
        self.status = status

    def urgent(self) -> bool:
        return self.agent.notice_at is not None

    def run(self, now: float) -> None:
        a = self.agent
        if not a.stop_requested and (a.notice_at is not None or a.notices.notice()):
            a._on_notice(self.status, now)


class Rebalance(Check):
    """EC2's rebalance recommendation: an early checkpoint and sync (the agent's _on_rebalance)."""

    def urgent(self) -> bool:
        return (self.agent.rebalance_at or 0) > 0

    def run(self, now: float) -> None:
        a = self.agent
        if not a.stop_requested and a.notice_at is None:  # a notice, once seen, is the one to handle
            a._on_rebalance(now)


class Deadline(Check):
    """The run's `timeout_s` passed: stop it (a failure)."""

    def __init__(self, agent: Any, deadline: float):
        super().__init__(agent)
        self.deadline = deadline

    def run(self, now: float) -> None:
        if now > self.deadline:
            request_stop(self.agent, StopReason.TIMEOUT)


class StopCommand(Check):
    """A stop was asked for: SIGTERM the command once, SIGKILL it after KILL_GRACE_S (then the watch is over)."""

    def run(self, now: float) -> bool:
        a = self.agent
        if a.stop_requested and a.stop_sent_at is None:
            a._signal_command(signal.SIGTERM)
            a.stop_sent_at = now
        elif a.stop_sent_at and now - a.stop_sent_at > KILL_GRACE_S:
            a._signal_command(signal.SIGKILL)
            return True
        return False


class SyncUp(Check):
    """The run folder (checkpoints, metrics) and the log to the store, every `sync_s`."""

    def run(self, now: float) -> None:
        self.agent._sync_up()


class CheckpointSync(Check):
    """A checkpoint the command just completed (its manifest written) goes to the store at once, whatever
    `sync_s` is: what a lost host costs is the work since the newest checkpoint, not since the last sync."""

    def __init__(self, agent: Any, interval: float):
        super().__init__(agent, interval)
        self.synced = newest_checkpoint(agent.run_dir)  # restored: already in the store

    def run(self, now: float) -> None:
        newest = newest_checkpoint(self.agent.run_dir)
        if newest is not None and newest != self.synced:
            self.agent._sync_up()
            self.synced = newest


def request_stop(agent: Any, reason: StopReason) -> None:
    """The first reason asked for is the one the attempt ends with."""
    agent.stop_requested = agent.stop_requested or reason


def checks_for(agent: Any, status: Any, now: float) -> list[Check]:
    """The watch of one attempt whose command started at `now`, in the order its checks run."""
    t = agent.task
    checks: list[Check] = [
        CommandExited(agent),
        FindGroup(agent),
        WindowGone(agent, WINDOW_LOOK_S, first=now + WINDOW_LOOK_S),
        RungPassed(agent, status),
        Superseded(agent),
    ]
    if t.node_hosts > 1 and not agent.follower:
        checks.append(NodeFailed(agent, t.notice_poll_s))
    checks += [SpotNotice(agent, status, t.notice_poll_s), Rebalance(agent, t.notice_poll_s)]
    if t.timeout_s:
        checks.append(Deadline(agent, now + t.timeout_s))
    return checks + [
        StopCommand(agent),
        CheckpointSync(agent, CHECKPOINT_LOOK_S),
        SyncUp(agent, t.sync_s, first=now + t.sync_s),
    ]


def watch(checks: list[Check], poll_s: float = POLL_S) -> None:
    """Poll the checks until one says the attempt is over."""
    retry_until(lambda: any(c.tick(time.time()) for c in checks), timeout=None, interval=poll_s)
