"""The local backend: each run is an agent in its own tmux session on this machine.

Session name and paths come from the run contract (contract.py): <workdir>/<sweep>/<run>/{run,ctl}.
tmux refuses a second session of the same name, so a run can never run twice at once here.
"""

from __future__ import annotations

import builtins
import os
import sys
from pathlib import Path

from orchestrator import contract
from orchestrator.backends.base import BackendBase, Host
from orchestrator.backends.local import tmux_server
from orchestrator.backends.local.settings import LocalSection
from orchestrator.contract import RunTask
from orchestrator.errors import OrchError
from orchestrator.host import tmux
from orchestrator.remote.runners import LocalRunner
from orchestrator.store.folder import usable_folder
from orchestrator.store.lifecycle import StopReason
from orchestrator.store.s3url import is_s3
from orchestrator.sweep.spec import Sweep, orch_home
from orchestrator.sweep.tasks import new_task

STOP_WAIT_S = 20.0  # the agent's own kill grace is 10 s
# On a store that bills each request (S3) the agents' signs of life go through a file beside them, which list()
# reads for free (the silence limit, stale_s, keeps its meaning); the record is then rewritten only this often
# (or when its state or a rung changes), and the run folder synced this often (a new checkpoint at once).
METERED_RECORD_S = 60.0
METERED_SYNC_S = 120.0


class LocalBackend(BackendBase):
    name = "local"
    stale_s = 30.0  # agents heartbeat every second here
    start_timeout_s = 60.0
    releases_interrupted_host = False  # the agent ends its own session; the next attempt reuses the name

    def __init__(self, sweep: Sweep):
        self.sweep = sweep
        self.settings = local = sweep.spec.section_as("local", LocalSection)
        self.workdir = Path(os.path.expanduser(local.workdir)) if local.workdir else orch_home() / "work"
        cores = os.cpu_count() or 1
        self.threads = local.threads_per_run or max(1, cores // min(sweep.spec.max_parallel, cores))
        self.host = LocalRunner()
        self.metered = is_s3(sweep.store_url)

    def session(self, run_id: str) -> str:
        return contract.session_name(self.sweep.spec.name, run_id)

    def ctl_dir(self, run_id: str) -> str:
        return contract.ctl_dir(str(self.workdir), self.sweep.spec.name, run_id)

    def list(self) -> builtins.list[Host]:
        by_session = {self.session(r.run_id): r.run_id for r in self.sweep.runs}
        return [
            Host(run_id=by_session[s], host_id=s, address="localhost", **self.reported(by_session[s]))
            for s in tmux_server.sessions(contract.session_prefix(self.sweep.spec.name))
            if s in by_session
        ]

    def reported(self, run_id: str) -> dict:
        """The agent's sign of life (contract.REPORTED_FILE): when it last beat, and its record's version."""
        path = Path(self.ctl_dir(run_id)) / contract.REPORTED_FILE
        try:
            return {"seen": path.stat().st_mtime, "mark": path.read_text()}
        except OSError:
            return {}

    def new_task(self, run_id: str, attempt: int, command: str, params_json: str, replaces: str = "") -> RunTask:
        env = dict(os.environ)
        if self.settings.threads_per_run:  # the sweep's own setting wins over the shell's
            env["OMP_NUM_THREADS"] = str(self.threads)
        else:
            env.setdefault("OMP_NUM_THREADS", str(self.threads))
        env.pop("TMUX", None)
        env["ORCH_PYTHON"] = sys.executable
        return new_task(
            self.sweep,
            run_id,
            attempt,
            command,
            params_json,
            str(self.workdir),
            env=env,
            heartbeat_s=1.0,
            record_s=METERED_RECORD_S if self.metered else None,
            notice_poll_s=1.0,
            sync_s=METERED_SYNC_S if self.metered else 2.0,
            host="localhost",
            replaces=replaces,
            nodes_here=self.sweep.spec.resources.nodes if self.sweep.spec.resources else 1,
        )

    def start(self, task: RunTask) -> Host:
        if tmux_server.has_session(task.session):
            raise OrchError(f"run {task.run_id} already has a live session {task.session}; not starting it twice.")
        task_file = Path(contract.task_file(task.ctl_dir, task.attempt))
        task.save(task_file)
        pythonpath = os.pathsep.join(p for p in [_package_root(), os.environ.get("PYTHONPATH", "")] if p)
        command = contract.agent_command(sys.executable, str(task_file), task.ctl_dir)
        root = Path(task.run_dir).parent
        root.mkdir(parents=True, exist_ok=True)
        tmux_server.new_session(task.session, command, window="agent", cwd=str(root), env={"PYTHONPATH": pythonpath})
        return Host(run_id=task.run_id, host_id=task.session, address="localhost")

    def release(self, host: Host) -> None:
        tmux_server.kill_session(host.host_id)

    def notify_interruption(self, run_id: str) -> bool:
        if not tmux_server.has_session(self.session(run_id)):
            return False
        self.host.put_bytes(b"chaos\n", contract.notice_path(self.ctl_dir(run_id)), mode=0o644)
        return True

    def stop(self, run_id: str, reason: StopReason) -> bool:
        session = self.session(run_id)
        if not tmux_server.has_session(session):
            return False
        r = self.host.run(
            contract.stop_script(self.ctl_dir(run_id), session, reason, STOP_WAIT_S, tmux.socket_name()),
            timeout=STOP_WAIT_S + 10,
        )
        if r.code != 0:  # it did not end in time (or never had an agent): end its session
            tmux_server.kill_session(session)
        return True

    def attach(self, run_id: str, node: int = 0) -> int:
        if node:
            raise OrchError(
                f"--node {node}: on the local backend every node of a run runs in its one window; attach without "
                "--node."
            )
        session = self.session(run_id)
        if not tmux_server.has_session(session):
            raise OrchError(
                f"run {run_id} is not running (no tmux session {session}). See its log with `orch logs {run_id}`."
            )
        argv = tmux.attach_argv(session, "run")
        os.execvpe(
            argv[0], argv, {k: v for k, v in os.environ.items() if k != "TMUX"}
        )  # TMUX set: we may be inside tmux
        return 0

    def preflight(self) -> None:
        """The work folder must be usable before any run starts (tmux is checked by its first call)."""
        usable_folder(self.workdir, "the work folder (`local.workdir`)", "Pick a folder you can write.")


def _package_root() -> str:
    return str(Path(__file__).resolve().parents[3])
