"""The remote controller's instance under systemd on the fake cloud: a killed supervisor is restarted, and once
nothing is left to renew the sweep's lease the watchdog ends the instance (it billed until max_hours before)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path

import pytest

from orchestrator.wait import retry_until
from tests.conftest import run_states as status
from tests.e2e.aws.test_remote_launch import controller_ids, remote_sweep
from tests.fakecloud import processes_of

pytestmark = pytest.mark.slow


def pids_running(instance: str, word: bytes) -> list[int]:
    found = []
    for pid in processes_of(instance):
        try:
            if word in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            continue
    return found


def kill(pids) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.timeout(1200)
def test_a_killed_supervisor_is_restarted_and_with_everything_killed_the_watchdog_ends_the_instance(
    orch, cloud, identity, job
):
    path = remote_sweep(orch, cloud, identity, job, "orphan")
    r = orch("launch", str(path), "--remote", timeout=600)
    assert r.code == 0, r.out[-3000:] + r.err[-3000:]
    [ctl] = controller_ids(cloud, "orphan")
    units = cloud.hosts[ctl].root / "systemd"
    assert (units / "orch-supervisor.service.enabled").exists() and (units / "orch-watchdog.service.enabled").exists()
    retry_until(lambda: status(orch, "orphan").get("run", {}).get("state") == "running", 180, 0.5, "the run to start")

    # an out-of-memory kill of the supervisor: systemd stops the controller it left (SIGTERM) and starts it again
    first = int((units / "orch-supervisor.service.pid").read_text())
    [old] = pids_running(ctl, b"_controller")
    kill([first])
    seen = []

    def restarted() -> bool:
        """The restarted supervisor's controller holds the lease; meanwhile it never reads as the sweep's end."""
        lease = json.loads(orch("status", "orphan", "--json").out)["controller"]
        seen.append(lease)
        return lease["holder"]["pid"] != old and lease["holder"]["pid"] in pids_running(ctl, b"_controller")

    retry_until(restarted, 240, 2.0, "the restarted supervisor's controller to hold the lease")
    ended = [s for s in seen if s["ended"] is not None or not s["alive"]]
    assert not ended, ended  # a relaunch, `orch status` or the watchdog would have taken it for the sweep's end
    assert old not in pids_running(ctl, b"_controller") and seen[-1]["holder"]["instance_id"] == ctl
    assert controller_ids(cloud, "orphan") == [ctl]

    # now everything but the watchdog dies, systemd's restarts included: nothing renews the lease
    kill([int((units / "orch-supervisor.service.manager").read_text())])
    kill(pids_running(ctl, b"_supervise"))
    kill(pids_running(ctl, b"_controller"))
    assert pids_running(ctl, b"_watchdog")
    # the lease lapses 120 s after its last heartbeat; the watchdog looks once a minute
    retry_until(lambda: not controller_ids(cloud, "orphan"), 420, 2.0, "the watchdog to end the instance")
    log = orch("logs", "--controller", "orphan").out
    assert "watchdog: the sweep's lease lapsed" in log and "terminating this instance" in log, log[-3000:]
    assert not (cloud.gone_host(ctl).root / "shutdown").exists()  # TerminateInstances was enough

    d = orch("down", "orphan")
    assert d.code == 0, d.out + d.err
    assert not any(cloud.leftovers("orphan").values()), cloud.leftovers("orphan")
