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


def test_the_work_span_counts_only_the_attempts_own_lines_on_one_clock(tmp_path):
    import json

    from orchestrator.host.attempt import RungWatch
    from orchestrator.store.lifecycle import RunStatus

    metrics = tmp_path / "metrics.jsonl"
    lines = [{"epoch": 1, "elapsed_s": 10}, {"epoch": 2, "elapsed_s": 20}]  # restored: an earlier attempt's
    metrics.write_text("".join(json.dumps(x) + "\n" for x in lines))
    watch = RungWatch(metrics, work_key="epoch")
    watch.begin_attempt()
    with open(metrics, "a") as f:
        for x in ({"epoch": 3, "elapsed_s": 25}, {"loss": 1}, {"epoch": 4, "time": 9e9}, {"epoch": 5, "elapsed_s": 31}):
            f.write(json.dumps(x) + "\n")
    status = RunStatus(run_id="r")
    watch.report(status)
    assert status.work == [3, 25, 5, 31]  # (the line with only `time` is on another clock: passed over)
