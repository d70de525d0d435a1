"""A host that outlives its run (control/ended.py): an agent records its run's end and then terminates its instance.
One that dies in between leaves an instance nothing on it will end (the safety net's shutdown is hours away): the
controller ends it, and `orch launch` returns only once nothing of the sweep runs."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from orchestrator.control.ended import ENDED_HOST_S
from orchestrator.wait import retry_until
from tests.conftest import run_states as status
from tests.fakecloud.cloud import processes_of

pytestmark = pytest.mark.slow


@pytest.mark.timeout(600)
def test_an_instance_whose_agent_died_after_the_end_is_terminated_before_launch_returns(orch, cloud, identity):
    path = orch.sweep(cloud.sweep_yaml("ended", identity, "echo trained", heartbeat_s="1", sync_s="2"))
    release = cloud.gate.hold["TerminateInstances"] = threading.Event()  # the agent's own call waits here
    try:
        p = orch.popen("launch", str(path))
        retry_until(lambda: "TerminateInstances" in cloud.gate.held, 300, 0.2, "the agent to end its instance")
        (iid,) = [i["id"] for i in cloud.instances("ended")]
        for pid in processes_of(iid):  # the host hangs there: its agent, sshd, tmux, all of it
            os.kill(pid, signal.SIGKILL)
        retry_until(lambda: not processes_of(iid), 30, 0.1, "the host's processes to be gone")
    finally:
        del cloud.gate.hold["TerminateInstances"]
        release.set()  # the held call is answered RequestExpired, to nobody
    assert [i["id"] for i in cloud.instances("ended")] == [iid]  # nothing on the host will end it now
    out = p.communicate(timeout=ENDED_HOST_S + 240)[0]
    assert p.returncode == 0 and "Traceback" not in out, out
    assert cloud.instances("ended") == [], out  # when `orch launch` returns, nothing of the sweep runs
    assert "its agent did not end it); releasing it" in out and iid in out, out
    assert status(orch, "ended")["run"]["state"] == "succeeded"
    d = orch("down", "ended")
    assert d.code == 0 and not any(cloud.leftovers("ended").values()), d.out + d.err
