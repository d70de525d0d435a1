"""What only the host knows about a run's shape: its GPUs and a free rendezvous port, filled in by the agent."""

from __future__ import annotations

import shutil
import socket
import subprocess
from typing import Dict

from orchestrator.contract import AUTO


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


def complete_on_host(env: Dict[str, str]) -> Dict[str, str]:
    """What only the host knows, filled in by the agent at the start of an attempt: its GPUs (for
    `auto`) and a free rendezvous port on node 0."""
    done = dict(env)
    if "ORCH_NODES" not in done:
        return done
    if done.get("ORCH_GPUS") == AUTO or done.get("ORCH_PROCS_PER_NODE") == AUTO:
        gpus = host_gpus()
        if done.get("ORCH_GPUS") == AUTO:
            done["ORCH_GPUS"] = str(gpus)
        if done.get("ORCH_PROCS_PER_NODE") == AUTO:
            done["ORCH_PROCS_PER_NODE"] = str(max(1, int(done["ORCH_GPUS"])))
    if not done.get("ORCH_MASTER_PORT"):
        done["ORCH_MASTER_PORT"] = str(free_port())
    return done
