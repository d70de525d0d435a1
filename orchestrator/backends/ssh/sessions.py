"""What the ssh backend runs in a host's shell for its tmux sessions: start one (with where it sits as session
options), list them, end them with every process in them, attach to one. Only sessions named after the sweep on
orch's own tmux socket (`tmux -L orch`): nothing else on the host is touched."""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass

from orchestrator import contract
from orchestrator.backends.ssh.settings import HostSpec
from orchestrator.contract import RunTask

SOCKET = contract.REMOTE_TMUX_SOCKET
FORMAT = "#{session_name} #{@orch_attempt} #{@orch_slot} #{@orch_node} #{@orch_nodes}"
LIST = f"tmux -L {SOCKET} ls -F {shlex.quote(FORMAT)} 2>/dev/null; true"


@dataclass(frozen=True)
class Placed:
    """Where a run's attempt sits on a host: its slot there, and its node of the attempt's hosts."""

    attempt: int
    slot: int
    node: int = 0
    nodes: int = 1


def start_command(task: RunTask, agent: str, placed: Placed) -> str:
    """One tmux command sequence: the options land on the session it just made."""
    return (
        f'cd "$HOME" && tmux -L {SOCKET} new-session -d -s {shlex.quote(task.session)} -n agent -x 200 -y 50 '
        f"{shlex.quote(agent)} ';' set-option @orch_attempt {placed.attempt} ';' set-option @orch_slot {placed.slot} "
        f"';' set-option @orch_node {placed.node} ';' set-option @orch_nodes {placed.nodes}"
    )


def parse(out: str, prefix: str) -> dict[str, Placed]:
    """LIST's answer: the sessions named with `prefix`, and where each sits."""
    found = {}
    for line in out.splitlines():
        name, _, rest = line.partition(" ")
        if name.startswith(prefix):
            nums = [int(w) if w.isdigit() else 0 for w in (rest.split() + ["0"] * 4)[:4]]
            found[name] = Placed(nums[0], nums[1], nums[2], max(1, nums[3]))
    return found


def attach_argv(spec: HostSpec, known_hosts: str, key: str | None, remote: str) -> list[str]:
    """The system ssh, with the user's known_hosts checked strictly, running `remote` in a terminal."""
    argv = ["ssh", "-t", "-p", str(spec.port), "-o", f"UserKnownHostsFile={os.path.expanduser(known_hosts)}"]
    argv += ["-o", "StrictHostKeyChecking=yes"] + (["-i", os.path.expanduser(key)] if key else [])
    return [*argv, f"{spec.user}@{spec.address}", remote]


def kill_script(session: str, every: bool = False) -> str:
    """End a run's session (every: each session whose name starts with `session`) and every process of its panes at
    once: each pane's command leads a process group of its own, killed whole (an agent busy writing its last record
    would otherwise outlive its session). Touches nothing else on the host."""
    pick = f"grep '^{session}'" if every else f"grep -Fx {shlex.quote(session)}"
    return (
        f"for s in $(tmux -L {SOCKET} ls -F '#{{session_name}}' 2>/dev/null | {pick}); do "
        f'for p in $(tmux -L {SOCKET} list-panes -s -t "=$s" -F "#{{pane_pid}}" 2>/dev/null); do '
        f'kill -KILL -- "-$p" 2>/dev/null || kill -KILL "$p" 2>/dev/null; done; '
        f'tmux -L {SOCKET} kill-session -t "=$s" 2>/dev/null; done; true'
    )
