"""A run's job as Slurm gets it: sbatch's options and the batch script, which starts the agent in a tmux server of
the job's own (so `orch attach` sees the command live, and nothing of it outlives the job) and passes Slurm's signals
on as orch's protocol:

- USR1, `warn_s` before the time limit (`--signal=B:USR1@warn_s`): a notice (ctl/spot-notice). The agent
  checkpoints, records the attempt interrupted and ends it; the controller resumes the run in a new job.
- USR2 (orch's own stop: `orch down`, cancel, prune; its reason is in ctl/stop-reason first) and TERM (Slurm ends
  the job: a requeue, a preemption, a node going down, someone's scancel): SIGTERM to the agent. Without orch's stop
  file the agent ends the attempt interrupted (the task's `scheduled` part), never as a failure.

A job Slurm requeued and starts again exits at once: its attempt ended when Slurm took it, and the controller has
started the next one as a new job (Slurm holds a requeued job back for minutes).
"""

from __future__ import annotations

import shlex

from orchestrator import contract
from orchestrator.backends.slurm.settings import SlurmSection
from orchestrator.contract import RunTask
from orchestrator.host.tmux import SOCKET_ENV

JOB_SUFFIX = ".a"  # a job's name: the run's session name, `.a`, the attempt


def job_name(session: str, attempt: int) -> str:
    return f"{session}{JOB_SUFFIX}{attempt}"


def parse_name(name: str) -> tuple[str, int] | None:
    """(session, attempt) of one of orch's job names; None for any other job."""
    session, sep, attempt = name.rpartition(JOB_SUFFIX)
    return (session, int(attempt)) if sep and attempt.isdigit() else None


def options(settings: SlurmSection, name: str, gpus: int, output: str) -> list[str]:
    """sbatch's options for one job: orch's own, then the section's fields, then `slurm.sbatch` as written."""
    opts = [
        f"--job-name={name}",
        f"--output={output}",
        "--open-mode=append",
        "--requeue",
        f"--signal=B:USR1@{settings.warn_s}",
        "--nodes=1",
        "--ntasks=1",
    ]
    for flag, value in (
        ("partition", settings.partition),
        ("account", settings.account),
        ("qos", settings.qos),
        ("time", settings.time),
    ):
        if value:
            opts.append(f"--{flag}={value}")
    if gpus:
        opts.append(f"--gres=gpu:{gpus}")
    return opts + list(settings.sbatch)


def batch_script(task: RunTask, agent: str) -> str:
    ctl = contract.sh_path(task.ctl_dir)
    session = shlex.quote(task.session)
    target = shlex.quote("=" + task.session)
    return f"""#!/bin/bash
# Written by orch: attempt {task.attempt} of a run (its task: task-{task.attempt}.json in $CTL).
CTL={ctl}
if [ "${{SLURM_RESTART_COUNT:-0}}" != 0 ]; then
  echo "[orch] Slurm requeued job $SLURM_JOB_ID; orch resumes the run in a new job"; exit 0
fi
export {SOCKET_ENV}="orch-job$SLURM_JOB_ID"
T="tmux -L orch-job$SLURM_JOB_ID"
mkdir -p "$CTL" && rm -f "$CTL/{contract.AGENT_PID_FILE}"
stop_agent() {{ kill -TERM "$(cat "$CTL/{contract.AGENT_PID_FILE}" 2>/dev/null)" 2>/dev/null; }}
trap 'touch "$CTL/{contract.NOTICE_FILE}"' USR1
trap stop_agent USR2 TERM
$T -D -f /dev/null </dev/null & server=$!
SOCK="${{TMUX_TMPDIR:-/tmp}}/tmux-$(id -u)/orch-job$SLURM_JOB_ID"
for _ in $(seq 300); do [ -S "$SOCK" ] && break; sleep 0.1; done
$T new-session -d -s {session} -n agent -x 200 -y 50 {shlex.quote(agent)} || {{ kill "$server"; exit 1; }}
while $T has-session -t {target} 2>/dev/null; do sleep 1 & wait $!; done
$T kill-server 2>/dev/null; kill "$server" 2>/dev/null; wait "$server" 2>/dev/null
exit 0
"""
