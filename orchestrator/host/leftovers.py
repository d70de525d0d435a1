"""What a command left running when it exited: its process group is given a short grace, then SIGTERM, then SIGKILL.

Runs on the host (the agent imports it): standard library only.
"""

from __future__ import annotations

import os
import signal

from orchestrator.host.attempt import group_runs
from orchestrator.wait import Timeout, retry_until

LEFTOVER_GRACE_S = 2.0  # after the command exited, how long what it left in the background may finish


def stop_leftovers(group: int | None) -> None:
    """The run ends when its command exits: what it left running in its process group (`group`, led by the
    command's wrapper) is stopped after a short grace. Never the caller's own group."""
    if group is None or group == os.getpgid(0):
        return

    def gone() -> bool:
        return not group_runs(group)

    for sig, wait_s in ((None, LEFTOVER_GRACE_S), (signal.SIGTERM, 2.0), (signal.SIGKILL, 2.0)):
        if sig is not None:
            try:
                os.killpg(group, sig)
            except (ProcessLookupError, PermissionError):
                return
        try:
            retry_until(gone, wait_s, 0.1, "the command's process group to end")
            return
        except Timeout:
            continue
