"""What only the host knows about an attempt, kept apart from its task (which the controller built
whole): the task's paths as this host spells them, its GPUs and a free rendezvous port."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.contract import AUTO, RunTask


def host_gpus() -> int:
    """GPUs on this host (nvidia-smi -L), 0 without a driver."""
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def complete_on_host(env: dict[str, str]) -> dict[str, str]:
    """What only the host knows, filled in by the agent at the start of an attempt: its GPUs (for
    `auto`), the rendezvous where the task leaves it "" and the agent's environment has it (a Slurm job's first node),
    else a free port on node 0."""
    done = dict(env)
    if "ORCH_NODES" not in done:
        return done
    if done.get("ORCH_GPUS") == AUTO or done.get("ORCH_PROCS_PER_NODE") == AUTO:
        gpus = host_gpus()
        if done.get("ORCH_GPUS") == AUTO:
            done["ORCH_GPUS"] = str(gpus)
        if done.get("ORCH_PROCS_PER_NODE") == AUTO:
            done["ORCH_PROCS_PER_NODE"] = str(max(1, int(done["ORCH_GPUS"])))
    for key in ("ORCH_MASTER_ADDR", "ORCH_MASTER_PORT"):  # "": the host's scheduler says (Slurm: the job's script)
        if done.get(key) == "" and os.environ.get(key):
            done[key] = os.environ[key]
    if not done.get("ORCH_MASTER_PORT"):
        done["ORCH_MASTER_PORT"] = str(free_port())
    return done


@dataclass
class HostFacts:
    """An attempt's facts as this host has them; the agent fills them, the task stays as it came."""

    run_dir: Path  # the task's run_dir, `~` expanded
    ctl_dir: Path  # the task's ctl_dir, `~` expanded
    data: list[dict[str, str]]  # the task's `data:` entries, their `to` expanded
    env: dict[str, str] = field(default_factory=dict)  # laid over the task's env for the command
    code_dir: Path | None = None  # `workdir:` unpacked, the command's current directory (None: the run folder)

    @classmethod
    def of(cls, task: RunTask) -> HostFacts:
        run_dir, ctl_dir = (Path(p).expanduser() for p in (task.run_dir, task.ctl_dir))
        env = {"ORCH_RUN_DIR": str(run_dir)}
        if "ORCH_DATA_DIR" in task.env:
            env["ORCH_DATA_DIR"] = os.path.expanduser(task.env["ORCH_DATA_DIR"])
        code_dir = Path(task.code_dir).expanduser() if task.code_dir else None
        if code_dir is not None:
            env["ORCH_WORKDIR"] = str(code_dir)
        data = [{"from": e["from"], "to": os.path.expanduser(e["to"])} for e in task.data]
        return cls(run_dir, ctl_dir, data, env, code_dir)

    @property
    def cwd(self) -> Path:
        """Where the command starts: the workdir's snapshot, else the run folder."""
        return self.code_dir or self.run_dir

    def command_env(self, task: RunTask) -> dict[str, str]:
        """The command's environment at its start: the task's, this host's facts over it, the shape completed
        (a port is picked then, so it is still free when the command binds it)."""
        return complete_on_host({**task.env, **self.env})
