"""Instances bought by a controller that died without handing the sweep over (SIGKILL, a crash, a lost laptop): the
controller that takes the sweep over finds each one in its first pass. One whose run's agent runs in its tmux session
reports soon; one without an agent (its instance bought, the controller killed before it started it) would idle,
billing, until the whole boot allowance ran out, since nobody is left to start it: it is released at once.
"""

from __future__ import annotations

import logging
import shlex
import time

from orchestrator import contract
from orchestrator.backends.aws.state import ProvisioningState
from orchestrator.errors import OrchError
from orchestrator.remote.ssh import connect

log = logging.getLogger("orch.aws")

REACH_S = 20.0  # how long the takeover waits for an orphan's sshd: longer, it may be booting, and nobody starts it


def orphan_deadline(state: ProvisioningState, inst: dict, start_timeout_s: float) -> float | None:
    """When the agent on an instance the dead controller bought must have reported (None: not such an instance):
    `start_timeout_s` from now when its agent runs, now when it has none. Asked once per instance and run."""
    if not state.orphans_before or (inst.get("launch_time") or state.orphans_before) >= state.orphans_before:
        return None
    key = (inst["instance_id"], inst["run"])
    if key not in state.adopted:
        runs = _agent_runs(state, inst)
        state.adopted[key] = time.time() + (start_timeout_s if runs else 0.0)
        if not runs:
            log.info("%s: %s has no agent (its controller died before starting it): released", *key[::-1])
    return state.adopted[key]


def _agent_runs(state: ProvisioningState, inst: dict) -> bool:
    """Whether the run's agent session is on the instance (its sshd answering with the pinned host key)."""
    session = contract.session_name(state.name, inst["run"])
    try:
        conn = connect(state.target(inst), timeout=REACH_S, interval=1.0)
    except OrchError:  # no sshd (yet), or no pinned key: nothing runs there that anyone will start
        return False
    try:
        ask = f"tmux -L {contract.REMOTE_TMUX_SOCKET} has-session -t {shlex.quote('=' + session)}"
        return conn.run(ask, timeout=30).code == 0
    finally:
        conn.close()
