"""The agent: runs on the host inside the run's tmux session and owns one attempt of one run.

It is the supervisor: it restores the run folder from the store, starts the command in a tmux
window "run" (so `orch attach` shows it live), watches it (exit, timeout, stop, notices), syncs
the run folder to the store and records how the attempt ended. Its parts: the Reporter (the
record and its heartbeat thread), the watch (host/watch.py: small periodic checks, one job each),
the NoticeSource (control file or IMDS), the HostPolicy (what happens to the host afterwards) and
attempt.final_status() (pure: every input that decides how the attempt ended). The record (`status`)
changes state only through store/lifecycle.py's transitions, each of which gives a new record that
the agent then holds, under the reporter's lock. Usage:

    python -m orchestrator.host.agent TASK.json
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import sys
import threading
import time
from pathlib import Path

from orchestrator.contract import (
    AGENT_PID_FILE,
    HOST_NOTICES,
    NOTICE_FILE,
    REPORTED_FILE,
    RUNG_TAGS,
    SCHEDULED,
    SELF_TERMINATE,
    STOP_REASON_FILE,
    RunTask,
)
from orchestrator.host import folder, tmux, watch, workdir
from orchestrator.host.attempt import (
    RungWatch,
    final_status,
    pid_file,
    tail,
    usr1_targets,
    wrapper_script,
    write_private,
)
from orchestrator.host.aws.imds import ask_imds_patiently
from orchestrator.host.aws.slots import slot_value
from orchestrator.host.aws.tags import RungTags
from orchestrator.host.env import HostFacts
from orchestrator.host.leftovers import stop_leftovers
from orchestrator.host.nodes import FollowerReporter, Relay, await_node0, end_attempt, follower_done
from orchestrator.host.notices import NoticeSource, kept_stop, stop_reason
from orchestrator.host.policy import HostPolicy
from orchestrator.host.reporter import Reporter
from orchestrator.host.watch import POLL_S
from orchestrator.store import layout, open_store
from orchestrator.store import lifecycle as life
from orchestrator.store.base import Store
from orchestrator.store.lifecycle import Impossible, RunState, RunStatus, StopReason
from orchestrator.store.status import read_status
from orchestrator.wait import Timeout, retry_until

log = logging.getLogger("orch.agent")

FINAL_SYNC_S = 1800.0  # a finished attempt keeps trying this long to put its results in the store
# orch down's one sync of the checkpoint made on the stop. orch down waits for the agent's session (20 s here, 10 of
# them the kill grace; 30 s on AWS), then ends it: an upload after that could overwrite the next attempt's.
STOP_SYNC_S = 8.0


class Agent:
    def __init__(self, task: RunTask, store: Store | None = None):
        self.here = HostFacts.of(task)  # "~/..." on hosts
        self.stage_error: str | None = None  # data staging failed: the attempt fails with this reason
        self.setup_error: str | None = None  # the workdir could not be had, or `setup:` failed: likewise
        self.sync_error = ""  # why the final sync did not land
        self.task = task
        self.store = store or open_store(task.store_url)
        self.run_dir, self.ctl = self.here.run_dir, self.here.ctl_dir
        self.prefix = layout.run_prefix(task.sweep, task.run_id)
        self.exit_file = self.ctl / f"exit.{task.attempt}"
        self.log_file = self.ctl / "logs" / f"{task.attempt}.log"  # orch's, beside the run folder (never in it)
        self.cmd_group: int | None = None  # the command's process group, to stop what it leaves behind
        self.stop_requested: StopReason | None = None
        self.kept_stop = False  # the stop keeps what the command wrote (notices.kept_stop)
        self.node_failed: tuple | None = None  # (node, exit code) of a follower whose command failed
        self.stop_sent_at: float | None = None
        self.status = RunStatus(run_id=task.run_id)  # the attempt's record, once read (run())
        self.checks: list[watch.Check] = []  # the watch of the command, once it started
        # A run spanning several hosts: node 0 reports; the others follow its record (host/nodes.py).
        self.follower = task.node_rank > 0
        self.relay = Relay(self.store, layout.relay_key(task.sweep, task.run_id, task.attempt))
        metrics, rungs = self.run_dir / layout.METRICS_FILE, [] if self.follower else task.rungs
        self.rungs = RungWatch(metrics, task.rungs_at, rungs, task.rungs_metric, task.work_key)
        self.reporter = (
            FollowerReporter(self.store, task.sweep, task.run_id, task.attempt)
            if self.follower
            else Reporter(
                self.store,
                task.sweep,
                task.run_id,
                task.attempt,
                metrics,
                self.rungs,
                reported=self.ctl / REPORTED_FILE,
                record_s=task.record_s,
                rungs_recorded=RungTags().recorded if task.uses(RUNG_TAGS) else None,
            )
        )
        self.status_lock = self.reporter.lock  # the record is shared with the heartbeat thread
        self.notices = NoticeSource(
            self.ctl,
            task.uses(HOST_NOTICES),
            self.relay.received if task.node_hosts > 1 and not self.follower else None,
        )
        self.host_policy = HostPolicy(
            task.session, task.uses(SELF_TERMINATE), task.idle_s or 0, task.slot, slot_value(task.run_id, task.attempt)
        )

    # --- signals ---------------------------------------------------------------------------

    def _on_signal(self, signum, _frame) -> None:
        if self.stop_requested is None:
            path = self.ctl / STOP_REASON_FILE
            scheduled = self.task.uses(SCHEDULED)
            self.stop_requested = stop_reason(path, scheduled, signum == signal.SIGHUP)
            self.kept_stop = kept_stop(self.stop_requested, path.exists(), scheduled and signum == signal.SIGTERM)

    def relay_notice(self) -> None:
        """A follower's spot notice, passed on to node 0 (which checkpoints for the run)."""
        self._quietly(self.relay.send, self.task.node_rank)

    def interrupt(self, reason: str) -> None:
        """A spot notice handled: the checkpoint is in the store; the record says so before the command stops."""
        with self.status_lock:
            self.status = life.interrupt(self.status, reason)
            self.reporter.record(self.status)

    def _cmd_pid(self) -> int | None:
        try:
            return int((self.ctl / pid_file("cmd", self.task.attempt)).read_text())
        except (FileNotFoundError, ValueError):
            return None

    def signal_command(self, sig: int) -> None:
        pid = self._cmd_pid()
        if pid is None:
            return
        # SIGUSR1 ("checkpoint now") goes to every process of the command that handles it: under
        # torchrun those are the ranks, and torchrun itself would die of it, not forward it.
        targets = usr1_targets(pid) if sig == signal.SIGUSR1 else [pid]
        for target in targets:
            try:
                if sig == signal.SIGKILL:
                    os.killpg(os.getpgid(target), sig)  # the whole tree, wrapper included
                else:
                    os.kill(target, sig)
            except (ProcessLookupError, PermissionError):
                pass

    # --- the attempt ---------------------------------------------------------------------------

    def run(self) -> int:
        t = self.task
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        self.ctl.mkdir(parents=True, exist_ok=True)
        (self.ctl / AGENT_PID_FILE).write_text(str(os.getpid()))
        for stale in (STOP_REASON_FILE, NOTICE_FILE, REPORTED_FILE):  # meant for (or left by) an earlier attempt
            (self.ctl / stale).unlink(missing_ok=True)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        # Report before any slow work: the controller gives a silent new host only a short while.
        try:
            self.status = life.start(
                read_status(self.store, t.sweep, t.run_id),
                t.attempt,
                t.host or "localhost",
                "restoring the run folder from the store",
                code=t.code,
            )
        except Impossible as exc:  # the record ended (or cannot be read) before this agent began: not its to write
            log.error("%s; writing nothing", exc)
            self.host_policy.after_attempt()
            return 0
        if not self.reporter.record(self.status):  # the controller has already moved past this attempt
            self.host_policy.after_attempt()
            return 0
        # The reporter heartbeats on its own thread from here to the end: neither a large restore
        # nor a large checkpoint upload can make a live host look lost.
        with self.reporter.heartbeats(lambda: self.status, t.heartbeat_s):
            code = self._attempt()
            self._stop_leftovers()
            landed = self._final_sync()
            if self.follower:
                self.done_with_attempt(code)
            elif self.ends_for_every_node():  # every node's log in the store before the end is recorded
                end_attempt(
                    self.store, t.sweep, t.run_id, t.attempt, t.node_hosts, lambda: not self.reporter.superseded
                )
        await_node0(self.reporter, t.attempt)
        return self._finish(code, landed)

    def _attempt(self) -> int | None:
        """Restore, run the command in its window, watch it until it exits; its exit code (None if it vanished)."""
        t = self.task
        # A new attempt continues from what earlier attempts left in the store (checkpoints).
        self._restore()
        if not self._prepare():
            return None
        now = time.time()
        with self.status_lock:
            self.status = life.run(self.status, t.attempt, t.host or "localhost", now)
            self.reporter.record(self.status)
        self.rungs.begin_attempt()  # lines from here on are this attempt's: its work rate
        self._launch()
        self.checks = watch.checks_for(self, now)
        watch.watch(self.checks)
        try:
            return int(
                retry_until(
                    lambda: self.exit_file.exists() and self.exit_file.read_text().strip(), 2.0, POLL_S, "exit code"
                )
            )
        except (Timeout, ValueError):
            return None

    def _launch(self) -> None:
        """The command in its tmux window "run", through a wrapper script that records its exit code."""
        t = self.task
        env = self.here.command_env(t)  # the host's GPUs and a free rendezvous port (the run's shape)
        script = self.ctl / f"attempt-{t.attempt}.sh"
        write_private(script, wrapper_script(t, self.here, env, self.log_file))  # it holds the whole environment
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_file, "a") as f:  # the header from Python: user text never becomes shell syntax
            f.write(
                f"[orch] {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} attempt {t.attempt} of {t.run_id}: "
                f"{t.command}\n"
            )
        self.exit_file.unlink(missing_ok=True)
        for stale in (pid_file("cmd", t.attempt), pid_file("wrapper", t.attempt)):
            (self.ctl / stale).unlink(missing_ok=True)
        tmux.new_window(t.session, "run", f"bash {shlex.quote(str(script))}", cwd=str(self.here.cwd))

    def _final_sync(self) -> bool:
        """The run folder reaches the store before the end is recorded: a success whose results never got there
        is none. Tried until it lands (heartbeats go on meanwhile), the record moves on, orch stops the run, or
        FINAL_SYNC_S pass; False then."""
        failures = []
        if self._keeps_what_it_wrote() or self.follower and (self.reporter.superseded or self.stop_requested):
            self._sync_on_stop()  # (a follower syncs only its own log of this attempt: nothing a later one writes)

        def once() -> bool:  # a stop of the agent's own (a timeout, a failed node) ends the attempt as an exit does
            if self.reporter.superseded or self.stop_requested and not self.stop_requested.failure:
                return True
            try:
                self.sync_up()
                return True
            except Exception as exc:
                failures.append(f"{type(exc).__name__}: {exc}")
                log.warning("the run's results are not in the store yet (%s); trying again", failures[-1])
                with self.status_lock:
                    self.status.reason = f"the command ended; writing its results to the store ({failures[-1]})"
                return False

        try:
            retry_until(once, FINAL_SYNC_S, 2.0, "the store to take the run folder")
        except Timeout:
            self.sync_error = failures[-1] if failures else "no answer"
            return False
        return not (failures and (self.reporter.superseded or self.stop_requested))

    def _keeps_what_it_wrote(self) -> bool:
        return folder.keeps_what_it_wrote(self.store, self.task, self.kept_stop, self.reporter.superseded)

    def _sync_on_stop(self) -> None:
        """Orch stopped the command (see _keeps_what_it_wrote): its folder and log go to the store (after `orch
        down`, with the checkpoint it made on its SIGTERM, which the next launch resumes from). One try, for at most
        STOP_SYNC_S: orch waits only so long for the agent's session."""
        sync = threading.Thread(target=self._quietly, args=(self.sync_up,), name="stop-sync", daemon=True)
        sync.start()
        sync.join(STOP_SYNC_S)
        if sync.is_alive():  # the process ends soon after; a checkpoint cut half-way fails its manifest: not restored
            log.warning(
                "what the command wrote did not all reach the store in %.0f s; a run resumed later continues from "
                "its newest stored checkpoint",
                STOP_SYNC_S,
            )

    def _finish(self, code: int | None, landed: bool = True) -> int:
        """Record how the attempt ended, then leave the host as its policy says."""
        t = self.task
        with self.status_lock:
            self.rungs.report(self.status)  # the newest line, and the values at rungs the last lines passed
        ending = final_status(
            self.stop_requested,
            any(check.preempted(code) for check in self.checks),
            code,
            t.timeout_s,
            node_failed=self.node_failed,
            stage_error=self.stage_error or "",
            setup_error=self.setup_error or "",
            unsynced=""
            if landed
            else f"its results could not be written to the store for {FINAL_SYNC_S / 60:.0f} min ({self.sync_error}); "
            f"they are in {self.run_dir} on {t.host or 'localhost'}",
            run_id=t.run_id,
        )
        if self.stop_requested is StopReason.NODE_FAILED and self.node_failed:
            code = self.node_failed[1]  # the attempt's exit code is the failed node's
        with self.status_lock:
            self.status = life.finish(
                self.status, ending, code, "" if ending.state == RunState.SUCCEEDED else tail(self.log_file)
            )
        if not self.follower:
            try:  # the record of how it ended matters most: a store that is briefly unwritable gets a minute
                retry_until(
                    lambda: self.reporter.superseded or self._quietly(self.reporter.record, self.status),
                    60,
                    2.0,
                    "the store to take the final status",
                )
            except Timeout:
                log.error(
                    "could not record the end of attempt %s in the store; the controller will see a lost host",
                    t.attempt,
                )
        self.host_policy.after_attempt()
        return 0

    def ends_for_every_node(self) -> bool:
        """Node 0 of a run on several hosts ends the attempt itself (its command exited, a node failed, a timeout):
        the followers are told to stop and sync their logs (host/nodes.py). orch's own stops reach every node."""
        stop = self.stop_requested
        return self.task.node_hosts > 1 and not self.reporter.superseded and (stop is None or stop.failure)

    def done_with_attempt(self, code: int | None) -> None:
        """A follower after its last sync: node 0 may record the end; a command that failed fails the attempt."""
        t = self.task
        self._quietly(follower_done, self.store, t.sweep, t.run_id, t.attempt, t.node_rank)
        if code not in (0, None) and not self.stop_requested:  # this node failed: so did the attempt (node 0's record)
            self._quietly(
                self.store.put_bytes,
                layout.node_exit_key(t.sweep, t.run_id, t.attempt, t.node_rank),
                f"{code}\n".encode(),
            )

    def _prepare(self) -> bool:
        """Before the command: the sweep's data, `workdir:`'s snapshot and `setup:` (host/workdir.py)."""
        return workdir.before_command(self)

    def doing(self, reason: str) -> None:
        """What the attempt is busy with before its command runs, in its record."""
        with self.status_lock:
            self.status.reason = reason
            self.reporter.record(self.status)

    def _restore(self) -> None:
        """The run folder as the last attempt left it, with its newest checkpoint that verifies (host/folder.py)."""
        folder.restore(self.store, self.task, self.run_dir, self.reporter.count)

    def sync_up(self) -> None:
        folder.sync_up(self.store, self.task, self.run_dir, self.log_file, self.reporter.count)

    def _quietly(self, fn, *args) -> bool:
        """A store write that fails (read-only folder, network) is logged and tried again later, never fatal."""
        try:
            fn(*args)
            return True
        except Exception as exc:
            log.warning("store write failed (%s: %s); will try again", type(exc).__name__, exc)
            return False

    def group_of_command(self) -> int | None:
        """The wrapper leads the process group of its tmux pane: the command, the log's tee, and whatever they start."""
        try:
            return int((self.ctl / pid_file("wrapper", self.task.attempt)).read_text())
        except (FileNotFoundError, ValueError):
            return None

    def _stop_leftovers(self) -> None:
        stop_leftovers(self.cmd_group or self.group_of_command())


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.INFO, format="%(asctime)s agent %(message)s")
    if len(args) != 1:
        log.error("usage: python -m orchestrator.host.agent TASK.json")
        return 2
    ask_imds_patiently(os.environ)  # its store credentials come from the instance metadata service
    return Agent(RunTask.load(Path(args[0]))).run()


if __name__ == "__main__":
    sys.exit(main())
