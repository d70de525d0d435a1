"""The local backend: each run is an agent in its own tmux session on this machine.

Session name: orch_<sweep>_<run> (tmux-safe). Working copies: <workdir>/<sweep>/<run>/{run,ctl}.
tmux refuses a second session of the same name, so a run can never run twice at once here.
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
from pathlib import Path
from typing import List

from .. import tmux
from ..agent import NOTICE_FILE, STOP_REASON_FILE
from ..errors import OrchError
from ..spec import Sweep, orch_home, session_safe
from ..wait import Timeout, retry_until
from .base import Host, RunTask

STOP_WAIT_S = 20.0  # the agent's own kill grace is 10 s


class LocalBackend:
    name = "local"
    stale_s = 30.0  # agents heartbeat every second here
    start_timeout_s = 60.0

    def __init__(self, sweep: Sweep):
        self.sweep = sweep
        local = sweep.spec.local
        self.workdir = Path(os.path.expanduser(local.workdir)) if local.workdir else orch_home() / "work"
        cores = os.cpu_count() or 1
        self.threads = local.threads_per_run or max(1, cores // min(sweep.spec.max_parallel, cores))
        self.prefix = f"orch_{sweep.spec.name}_"

    def session(self, run_id: str) -> str:
        return self.prefix + session_safe(run_id)

    def run_root(self, run_id: str) -> Path:
        return self.workdir / self.sweep.spec.name / run_id

    def list(self) -> List[Host]:
        by_session = {self.session(r.run_id): r.run_id for r in self.sweep.runs}
        return [Host(run_id=by_session[s], host_id=s, address="localhost") for s in tmux.sessions(self.prefix) if s in by_session]

    def task_env(self, task_params_json: str, run_id: str, attempt: int, run_dir: Path) -> dict:
        env = dict(os.environ)
        env.update(self.sweep.spec.env)
        env.setdefault("OMP_NUM_THREADS", str(self.threads))
        env.update(
            ORCH_SWEEP=self.sweep.spec.name,
            ORCH_RUN_ID=run_id,
            ORCH_ATTEMPT=str(attempt),
            ORCH_RUN_DIR=str(run_dir),
            ORCH_PARAMS_JSON=task_params_json,
            ORCH_PYTHON=sys.executable,
            PYTHONUNBUFFERED="1",
        )
        env.pop("TMUX", None)
        return env

    def start(self, task: RunTask) -> Host:
        root = self.run_root(task.run_id)
        task_file = Path(task.ctl_dir) / f"task-{task.attempt}.json"
        task.save(task_file)
        agent = f"{shlex.quote(sys.executable)} -m orchestrator.agent {shlex.quote(str(task_file))}"
        # The agent's own output goes to ctl/agent.log, so a crashed agent leaves its reason behind.
        command = f"{agent} 2>&1 | tee -a {shlex.quote(str(Path(task.ctl_dir) / 'agent.log'))}"
        env = {"PYTHONPATH": os.pathsep.join(p for p in [_package_root(), os.environ.get("PYTHONPATH", "")] if p)}
        if tmux.has_session(task.session):
            raise OrchError(f"run {task.run_id} already has a live session {task.session}; not starting it twice.")
        root.mkdir(parents=True, exist_ok=True)
        tmux.new_session(task.session, command, window="agent", cwd=str(root), env=env)
        return Host(run_id=task.run_id, host_id=task.session, address="localhost")

    def new_task(self, run_id: str, attempt: int, command: str, params_json: str) -> RunTask:
        root = self.run_root(run_id)
        run_dir = root / "run"
        spec = self.sweep.spec
        return RunTask(
            sweep=spec.name,
            run_id=run_id,
            attempt=attempt,
            command=command,
            store_url=self.sweep.store_url,
            run_dir=str(run_dir),
            ctl_dir=str(root / "ctl"),
            session=self.session(run_id),
            env=self.task_env(params_json, run_id, attempt, run_dir),
            timeout_s=spec.timeout_minutes * 60 if spec.timeout_minutes else None,
            heartbeat_s=1.0,
            notice_poll_s=1.0,
            sync_s=2.0,
            host="localhost",
        )

    def release(self, host: Host) -> None:
        tmux.kill_session(host.host_id)

    def notify_interruption(self, run_id: str) -> bool:
        """Deliver a spot notice the way the agent looks for one; False if the run has no live agent."""
        if not tmux.has_session(self.session(run_id)):
            return False
        (self.run_root(run_id) / "ctl" / NOTICE_FILE).write_text("chaos\n")
        return True

    def stop(self, run_id: str, reason: str) -> bool:
        session = self.session(run_id)
        if not tmux.has_session(session):
            return False
        ctl = self.run_root(run_id) / "ctl"
        (ctl / STOP_REASON_FILE).write_text(reason)
        try:
            os.kill(int((ctl / "agent.pid").read_text()), signal.SIGTERM)
        except (FileNotFoundError, ValueError, ProcessLookupError):
            tmux.kill_session(session)
        try:
            retry_until(lambda: not tmux.has_session(session), STOP_WAIT_S, 0.1, f"session {session} to end")
        except Timeout:
            tmux.kill_session(session)
        return True

    def attach(self, run_id: str) -> int:
        session = self.session(run_id)
        if not tmux.has_session(session):
            raise OrchError(f"run {run_id} is not running (no tmux session {session}). See its log with `orch logs {run_id}`.")
        argv = tmux.attach_argv(session, "run")
        os.execvpe(argv[0], argv, {k: v for k, v in os.environ.items() if k != "TMUX"})  # TMUX set: we may be inside tmux
        return 0

    def preflight(self) -> None:
        """The work folder must be usable before any run starts (tmux is checked by its first call)."""
        try:
            self.workdir.mkdir(parents=True, exist_ok=True)
            (self.workdir / ".probe").touch()
        except OSError as exc:
            raise OrchError(f"cannot use the work folder {self.workdir} (`local.workdir`): {exc.strerror or exc}. "
                            "Pick a folder you can write.", exit_code=2) from None

    def teardown(self) -> List[str]:
        return []


def _package_root() -> str:
    return str(Path(__file__).resolve().parents[2])
