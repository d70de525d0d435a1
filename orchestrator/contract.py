"""One run's layout and contract: names, paths, environment, the agent's start and the stop protocol.

Used by every backend and defined nowhere else. A backend supplies only primitives (run a shell
command on the host, put a file there, list hosts); what a run *is* comes from here.

On a host, a run lives under `<base>/<sweep>/<run>/`: `run/` is $ORCH_RUN_DIR (the command's
folder, synced to the store) and `ctl/` is the agent's private folder (task file, wrapper script,
pids, exit code, logs). Files in `ctl/` that others write to talk to the agent:
`stop-reason` (then SIGTERM to the pid in `agent.pid`) and `spot-notice`.
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING, Dict, Optional

from .backends.base import RunTask

if TYPE_CHECKING:  # the agent imports this module on hosts; keep pydantic out of its start-up
    from .spec import Sweep

STOP_REASON_FILE = "stop-reason"  # written by whoever stops the run, before signalling the agent
NOTICE_FILE = "spot-notice"  # `orch chaos interrupt` (and tests) deliver a spot notice here
AGENT_PID_FILE = "agent.pid"
AGENT_LOG_FILE = "agent.log"
REMOTE_BASE = "~/orch/runs"  # where runs live on an instance
REMOTE_TMUX_SOCKET = "orch"


def session_prefix(sweep: str) -> str:
    return f"orch_{sweep}_"


def session_name(sweep: str, run_id: str) -> str:
    """tmux treats '.' and ':' in targets as separators."""
    return session_prefix(sweep) + run_id.replace(".", "_").replace(":", "_")


def run_root(base: str, sweep: str, run_id: str) -> str:
    return f"{base.rstrip('/')}/{sweep}/{run_id}"


def ctl_dir(base: str, sweep: str, run_id: str) -> str:
    """The agent's private folder of a run on its host."""
    return f"{run_root(base, sweep, run_id)}/ctl"


def sh_path(path: str) -> str:
    """A path as one shell word; `~/...` stays expandable (as "$HOME/...")."""
    if path.startswith("~/"):
        return '"$HOME/' + path[2:].replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$").replace("`", "\\`") + '"'
    return shlex.quote(path)


def run_env(sweep: "Sweep", run_id: str, attempt: int, run_dir: str, params_json: str) -> Dict[str, str]:
    """The ORCH_* environment of one attempt (README: the run contract), over the sweep's `env:`."""
    from .shapes import shape_env

    env = dict(sweep.spec.env)
    env.update(ORCH_SWEEP=sweep.spec.name, ORCH_RUN_ID=run_id, ORCH_ATTEMPT=str(attempt), ORCH_RUN_DIR=run_dir,
               ORCH_PARAMS_JSON=params_json, PYTHONUNBUFFERED="1", ORCH_RDZV_ID=f"{sweep.spec.name}-{run_id}-{attempt}",
               **shape_env(sweep.spec.resources))
    return env


def new_task(sweep: "Sweep", run_id: str, attempt: int, command: str, params_json: str, base: str,
             env: Optional[Dict[str, str]] = None, **periods) -> RunTask:
    """The task of one attempt; `env` is laid under the contract's variables, `periods` are RunTask fields."""
    from .staging import resolve

    root = run_root(base, sweep.spec.name, run_id)
    minutes = sweep.spec.timeout_minutes
    data = resolve(sweep.spec.data, sweep.path.parent, f"{base.rstrip('/')}/.data")  # relative `to:`: beside the runs
    env = {**(env or {}), **({"ORCH_DATA_DIR": data[0]["to"]} if data else {})}
    return RunTask(sweep=sweep.spec.name, run_id=run_id, attempt=attempt, command=command, store_url=sweep.store_url,
                   run_dir=f"{root}/run", ctl_dir=ctl_dir(base, sweep.spec.name, run_id), session=session_name(sweep.spec.name, run_id),
                   env={**(env or {}), **run_env(sweep, run_id, attempt, f"{root}/run", params_json)},
                   timeout_s=minutes * 60 if minutes else None, data=data, **periods)


def agent_command(python: str, task_file: str, ctl_dir: str, pythonpath: Optional[str] = None) -> str:
    """The shell command that runs the agent for a task; its own output goes to ctl/agent.log."""
    prefix = f"PYTHONPATH={sh_path(pythonpath)} " if pythonpath else ""
    return (f"{prefix}{shlex.quote(python)} -m orchestrator.agent {sh_path(task_file)} "
            f"2>&1 | tee -a {sh_path(ctl_dir + '/' + AGENT_LOG_FILE)}")


def stop_script(ctl_dir: str, session: str, reason: str, wait_s: float, tmux_socket: str) -> str:
    """The stop protocol, as the host runs it: say why, SIGTERM the agent, wait for its session to end.

    Exit 0: it ended. Exit 3: the session was still there after wait_s (the caller may kill it).
    """
    ctl = ctl_dir.rstrip("/")
    return (f"echo {shlex.quote(reason)} > {sh_path(ctl + '/' + STOP_REASON_FILE)}; "
            f"kill -TERM \"$(cat {sh_path(ctl + '/' + AGENT_PID_FILE)} 2>/dev/null)\" 2>/dev/null; "
            f"for i in $(seq {max(1, int(wait_s * 10))}); do "
            f"tmux -L {shlex.quote(tmux_socket)} has-session -t {shlex.quote('=' + session)} 2>/dev/null || exit 0; sleep 0.1; done; exit 3")


def notice_path(ctl_dir: str) -> str:
    return f"{ctl_dir.rstrip('/')}/{NOTICE_FILE}"
