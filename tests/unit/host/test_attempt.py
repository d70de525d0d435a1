"""An attempt's process group (host/attempt.py): when it has ended."""

from __future__ import annotations

import os

import pytest

from orchestrator.wait import retry_until


@pytest.mark.slow
def test_a_process_group_whose_last_member_is_an_unreaped_zombie_has_ended():
    """The agent waits for the command's process group to end before it records the end of an attempt.
    The wrapper's parent is the tmux server, which may reap it seconds later: a zombie has ended (the
    agent used to wait 6 s — grace, SIGTERM, SIGKILL — for one, on about every other stop)."""
    import subprocess
    import sys

    from orchestrator.host.attempt import group_runs

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        assert group_runs(child.pid)  # a leader that runs
        os.kill(child.pid, 9)
        # not reaped (no wait()): still a member for kill(0), a zombie in /proc
        retry_until(
            lambda: open(f"/proc/{child.pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z", 30, 0.05, "the zombie"
        )
        os.killpg(child.pid, 0)  # the group still "exists" for a signal
        assert not group_runs(child.pid)
    finally:
        child.kill()
        child.wait()
    assert not group_runs(child.pid)
