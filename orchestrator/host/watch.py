"""The agent's watch over a running command: small periodic checks, each with its interval and one job.

In the manner of SkyPilot's skylet events: a check runs when it is due, does one thing, and an error
in it is logged and tried again a little later, never the end of the watch. The watch polls every
check in order, every POLL_S; the first that says the attempt is over ends it. Order matters where
one check acts on what an earlier one decided (the stop requests come before the signals).

A check is given the agent (host/agent.py) it watches for, as the `Watched` protocol says: its files, its
notices, its reporter. What a check learns over the attempt is its own state (a spot notice's time and the
checkpoint it asked for are SpotNotice's): the agent asks the checks at the end whether one preempted the
attempt (`Check.preempted`).
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from orchestrator.contract import RunTask
from orchestrator.host import tmux
from orchestrator.host.attempt import RungWatch, newest_checkpoint
from orchestrator.host.aws.slots import doom
from orchestrator.host.nodes import attempt_ending, failed_node
from orchestrator.host.notices import NoticeSource
from orchestrator.store import layout
from orchestrator.store.base import Store
from orchestrator.store.lifecycle import RunStatus, StopReason
from orchestrator.wait import retry_until

log = logging.getLogger("orch.agent")

POLL_S = 0.05  # how often the watch polls its checks (the command's exit is seen this fast)
ERROR_RETRY_S = 2.0  # a check that raised is tried again after this long at the soonest
WINDOW_LOOK_S = 2.0  # how often the agent looks for the command's tmux window
KILL_GRACE_S = 10.0  # SIGTERM -> SIGKILL
CHECKPOINT_LOOK_S = 1.0  # how often the agent looks for a newly completed checkpoint
NOTICE_GRACE_S = 60.0  # after a notice, how long to wait for the command's checkpoint before syncing anyway


class Watched(Protocol):
    """What the checks see of the agent they watch for (host/agent.py's Agent)."""

    task: RunTask
    store: Store
    run_dir: Path
    prefix: str  # the run folder's prefix in the store
    exit_file: Path  # written by the command's wrapper with its exit code
    follower: bool  # a node other than 0 of a run on several hosts
    rungs: RungWatch
    notices: NoticeSource
    status: RunStatus  # the attempt's record, as the agent last set it
    stop_requested: StopReason | None
    stop_sent_at: float | None
    node_failed: tuple[int, int] | None
    cmd_group: int | None

    @property
    def reporter(self) -> Reporting: ...  # read-only here: the agent's is a Reporter or a FollowerReporter

    def group_of_command(self) -> int | None: ...

    def signal_command(self, sig: int) -> None: ...

    def sync_up(self) -> None: ...

    def relay_notice(self) -> None: ...

    def interrupt(self, reason: str) -> None: ...


class Reporting(Protocol):
    """The agent's reporter as the checks use it (host/reporter.py, or host/nodes.py's for a follower)."""

    superseded: bool

    def beat(self, status: RunStatus, now: float | None = None) -> None: ...


class Check:
    """One periodic job. `interval` 0 runs at every poll; `first` is when it is first due (unix seconds)."""

    def __init__(self, agent: Watched, interval: float = 0.0, first: float = 0.0):
        self.agent, self.interval, self.next_at, self.hold_until = agent, interval, first, 0.0

    @property
    def name(self) -> str:
        return type(self).__name__

    def urgent(self) -> bool:
        """Due at every poll, whatever its interval (something it started is under way)."""
        return False

    def preempted(self, code: int | None) -> bool:
        """Whether what this check did ended the attempt as a preemption (the command exited with `code`)."""
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
            self.agent.cmd_group = self.agent.group_of_command()


class WindowGone(Check):
    """A wrapper that died without an exit code (its window killed) ends the attempt too."""

    def run(self, now: float) -> bool:
        return not tmux.has_window(self.agent.task.session, "run") and not self.agent.exit_file.exists()


class RungPassed(Check):
    """`prune:` a metrics line at a rung is reported now, not at the next heartbeat."""

    def run(self, now: float) -> None:
        if self.agent.rungs.passed():
            self.agent.reporter.beat(self.agent.status, now)


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


class AttemptEnding(Check):
    """A follower: node 0 said it ends the attempt (host/nodes.py), so this node stops too; its log is then synced
    before node 0 records the end."""

    def run(self, now: float) -> None:
        a, t = self.agent, self.agent.task
        if not a.stop_requested and attempt_ending(a.store, t.sweep, t.run_id, t.attempt):
            log.info("node 0 ends attempt %s: this node's part of it ends", t.attempt)
            request_stop(a, StopReason.SUPERSEDED)


class SpotNotice(Check):
    """A spot interruption notice: ask the command for a checkpoint now (SIGUSR1), then, once it is on disk (or
    NOTICE_GRACE_S passed, or the command exited), put it in the store, record the attempt interrupted and stop.
    Once seen, it is due at every poll. On a follower, the notice goes to node 0, which checkpoints for the run."""

    def __init__(self, agent: Watched, interval: float):
        super().__init__(agent, interval)
        self.at: float | None = None  # when the notice was seen
        self.ckpt_at: int | None = None  # the newest checkpoint then

    def urgent(self) -> bool:
        return self.at is not None

    def preempted(self, code: int | None) -> bool:
        return self.at is not None

    def run(self, now: float) -> None:
        a = self.agent
        if a.stop_requested or (self.at is None and not a.notices.notice()):
            return
        if a.follower:  # node 0 checkpoints for the whole run; this node ends when node 0's record does
            a.relay_notice()
            self.at = self.at or now
            return
        if self.at is None:
            if a.task.slot >= 0:  # a shared instance: nothing new may be placed on it
                _quietly(doom)
            self.at, self.ckpt_at = now, newest_checkpoint(a.run_dir)
            log.info("spot interruption notice: asking the command to checkpoint (SIGUSR1)")
            a.signal_command(signal.SIGUSR1)
            return
        newest = newest_checkpoint(a.run_dir)
        if newest == self.ckpt_at and now - self.at < NOTICE_GRACE_S and not a.exit_file.exists():
            return
        a.store.sync_up(a.run_dir, a.prefix, prune=layout.is_checkpoint)
        a.interrupt(
            f"spot interruption notice; checkpoint step {newest} in the store {time.time() - self.at:.1f} s later"
            if newest is not None
            else "spot interruption notice; the command left no checkpoint"
        )
        log.info("%s", a.status.reason)
        a.stop_requested = StopReason.INTERRUPTED


class Rebalance(Check):
    """EC2's rebalance recommendation comes before the two-minute notice, when it comes at all: checkpoint and sync
    now, and keep running, so that a notice later has little left to move. Once per attempt; a notice, once seen,
    is the one to handle."""

    def __init__(self, agent: Watched, interval: float, notice: SpotNotice):
        super().__init__(agent, interval)
        self.notice = notice
        self.at: float | None = None  # when the recommendation was seen (and SIGUSR1 sent)
        self.ckpt_at: int | None = None  # the newest checkpoint then
        self.handled = False

    def urgent(self) -> bool:
        return self.at is not None and not self.handled

    def preempted(self, code: int | None) -> bool:
        # our own SIGUSR1 ending a command that has no handler for it is a preemption, not the command's failure
        return self.at is not None and code == 128 + signal.SIGUSR1

    def run(self, now: float) -> None:
        a = self.agent
        if a.stop_requested or self.notice.at is not None or a.follower or self.handled:
            return  # (node 0 holds the run's checkpoints)
        if self.at is None:
            if not a.notices.rebalance():
                return
            self.at, self.ckpt_at = now, newest_checkpoint(a.run_dir)
            log.info("rebalance recommendation: asking the command for a checkpoint (SIGUSR1) and syncing it early")
            a.signal_command(signal.SIGUSR1)
        elif newest_checkpoint(a.run_dir) != self.ckpt_at or now - self.at > NOTICE_GRACE_S:
            a.store.sync_up(a.run_dir, a.prefix, prune=layout.is_checkpoint)
            log.info(
                "rebalance recommendation: checkpoint step %s in the store %.1f s later",
                newest_checkpoint(a.run_dir),
                time.time() - self.at,
            )
            self.handled = True


class Deadline(Check):
    """The run's `timeout_s` passed: stop it (a failure)."""

    def __init__(self, agent: Watched, deadline: float):
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
            a.signal_command(signal.SIGTERM)
            a.stop_sent_at = now
        elif a.stop_sent_at and now - a.stop_sent_at > KILL_GRACE_S:
            a.signal_command(signal.SIGKILL)
            return True
        return False


class SyncUp(Check):
    """The run folder (checkpoints, metrics) and the log to the store, every `sync_s`."""

    def run(self, now: float) -> None:
        self.agent.sync_up()


class CheckpointSync(Check):
    """A checkpoint the command just completed (its manifest written) goes to the store at once, whatever
    `sync_s` is: what a lost host costs is the work since the newest checkpoint, not since the last sync."""

    def __init__(self, agent: Watched, interval: float):
        super().__init__(agent, interval)
        self.synced = newest_checkpoint(agent.run_dir)  # restored: already in the store

    def run(self, now: float) -> None:
        newest = newest_checkpoint(self.agent.run_dir)
        if newest is not None and newest != self.synced:
            self.agent.sync_up()
            self.synced = newest


def request_stop(agent: Watched, reason: StopReason) -> None:
    """The first reason asked for is the one the attempt ends with."""
    agent.stop_requested = agent.stop_requested or reason


def checks_for(agent: Watched, now: float) -> list[Check]:
    """The watch of one attempt whose command started at `now`, in the order its checks run."""
    t = agent.task
    checks: list[Check] = [
        CommandExited(agent),
        FindGroup(agent),
        WindowGone(agent, WINDOW_LOOK_S, first=now + WINDOW_LOOK_S),
        RungPassed(agent),
        Superseded(agent),
    ]
    if t.node_hosts > 1:
        checks.append(AttemptEnding(agent, t.notice_poll_s) if agent.follower else NodeFailed(agent, t.notice_poll_s))
    notice = SpotNotice(agent, t.notice_poll_s)
    checks += [notice, Rebalance(agent, t.notice_poll_s, notice)]
    if t.timeout_s:
        checks.append(Deadline(agent, now + t.timeout_s))
    return checks + [
        StopCommand(agent),
        CheckpointSync(agent, CHECKPOINT_LOOK_S),
        SyncUp(agent, t.sync_s, first=now + t.sync_s),
    ]


def _quietly(fn: Callable[[], object]) -> None:
    """A step whose failure must not keep the notice from being handled (logged, not retried)."""
    try:
        fn()
    except Exception as exc:
        log.warning("%s failed (%s: %s)", getattr(fn, "__name__", "a step"), type(exc).__name__, exc)


def watch(checks: list[Check], poll_s: float = POLL_S) -> None:
    """Poll the checks until one says the attempt is over."""
    retry_until(lambda: any(c.tick(time.time()) for c in checks), timeout=None, interval=poll_s)
