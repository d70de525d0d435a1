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


def options(settings: SlurmSection, name: str, gpus: int, output: str, nodes: int = 1) -> list[str]:
    """sbatch's options for one job: orch's own, then the section's fields, then `slurm.sbatch` as written."""
    opts = [
        f"--job-name={name}",
        f"--output={output}",
        "--open-mode=append",
        "--requeue",
        f"--signal=B:USR1@{settings.warn_s}",
        f"--nodes={nodes}",
        f"--ntasks={nodes}",
        "--ntasks-per-node=1",
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
        opts.append(f"--gres=gpu:{gpus}")  # per node
    return opts + list(settings.sbatch)


def node_dirs(task: RunTask, rank: int) -> tuple[str, str]:
    """(run folder, control folder) of node `rank` of the attempt: node 0's are the run's; the others' sit beside
    them (the nodes share one filesystem, where each host of the ssh or aws backend has its own)."""
    if rank == 0:
        return task.run_dir, task.ctl_dir
    return node_ctl(task.ctl_dir, rank).removesuffix("/ctl") + "/run", node_ctl(task.ctl_dir, rank)


def node_ctl(ctl_dir: str, rank: int) -> str:
    """Node `rank`'s control folder, given the run's."""
    if rank == 0:
        return ctl_dir
    return f"{ctl_dir.rstrip('/').rsplit('/', 1)[0]}/node{rank}/ctl"


def node_script(task: RunTask, agents: list[str], python: str = "python3") -> str:
    """What runs on each node of the job (node.sh): the agent of node $SLURM_PROCID in a tmux server of its own, and
    Slurm's signals passed on to it (module doc). `agents`: each node's agent command, node 0's first."""
    cases = "\n".join(
        f"  {rank}) CTL={contract.sh_path(node_dirs(task, rank)[1])}; AGENT={shlex.quote(agent)} ;;"
        for rank, agent in enumerate(agents)
    )
    session, target = shlex.quote(task.session), shlex.quote("=" + task.session)
    return f"""#!/bin/bash
# Written by orch: one node's part of attempt {task.attempt} of a run.
RANK="${{SLURM_PROCID:-0}}"
case "$RANK" in
{cases}
  *) echo "[orch] no node $RANK in this attempt" >&2; exit 1 ;;
esac
for need in {shlex.quote(python)} tmux; do
  command -v "$need" >/dev/null && continue
  echo "[orch] no $need on $(hostname): install it there (the python: set slurm.python)" >&2; exit 1
done
S="orch-job$SLURM_JOB_ID.$RANK"
export {SOCKET_ENV}="$S"
T="tmux -L $S"
mkdir -p "$CTL" && rm -f "$CTL/{contract.AGENT_PID_FILE}"
stop_agent() {{ kill -TERM "$(cat "$CTL/{contract.AGENT_PID_FILE}" 2>/dev/null)" 2>/dev/null; }}
trap 'touch "$CTL/{contract.NOTICE_FILE}"' USR1
trap stop_agent USR2 TERM
$T -D -f /dev/null </dev/null & server=$!
SOCK="${{TMUX_TMPDIR:-/tmp}}/tmux-$(id -u)/$S"
for _ in $(seq 300); do [ -S "$SOCK" ] && break; sleep 0.1; done
$T new-session -d -s {session} -n agent -x 200 -y 50 "$AGENT" || {{ kill "$server"; exit 1; }}
while $T has-session -t {target} 2>/dev/null; do sleep 1 & wait $!; done
$T kill-server 2>/dev/null; kill "$server" 2>/dev/null; wait "$server" 2>/dev/null
exit 0
"""


def batch_script(task: RunTask, node_sh: str, nodes: int) -> str:
    """The job's script: node.sh here (one node), or on every node through srun, with the rendezvous at the job's
    first node (its address as Slurm reaches it, and a port from the job's id); Slurm's signals passed on to it."""
    run = f"bash {contract.sh_path(node_sh)} & child=$!"
    if nodes > 1:
        run = (
            'first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)\n'
            'addr=$(scontrol show node "$first" | tr " " "\\n" | sed -n "s/^NodeAddr=//p" | head -n 1)\n'
            'export ORCH_MASTER_ADDR="${addr:-$first}" ORCH_MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000))\n'
            f"srun --ntasks={nodes} --ntasks-per-node=1 --kill-on-bad-exit=0 bash {contract.sh_path(node_sh)} & "
            "child=$!"
        )
    return f"""#!/bin/bash
# Written by orch: attempt {task.attempt} of a run, on {nodes} node(s).
if [ "${{SLURM_RESTART_COUNT:-0}}" != 0 ]; then
  echo "[orch] Slurm requeued job $SLURM_JOB_ID; orch resumes the run in a new job"; exit 0
fi
{run}
trap 'kill -USR1 "$child" 2>/dev/null' USR1
trap 'kill -USR2 "$child" 2>/dev/null' USR2
trap 'kill -TERM "$child" 2>/dev/null' TERM
while kill -0 "$child" 2>/dev/null; do wait "$child"; done
exit 0
"""
