"""The remote controller's systemd units and start script (backends/aws/remote_units.py), and the watchdog's rule
(control/watchdog.py): what ends the controller's instance once its lease ended or lapsed."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from orchestrator.backends.aws.remote_units import SUPERVISOR_UNIT, WATCHDOG_UNIT, start_script, units
from orchestrator.control.lease import Holder, LeaseRecord
from orchestrator.control.watchdog import DEADLINE_GRACE_S, ENDED_GRACE_S, START_GRACE_S, verdict

ENV = {"PYTHONPATH": "/home/u/orch/code dir", "ORCH_HOME": "/home/u/orch/controller/home", "AWS_DEFAULT_REGION": "r"}


def written(tmp_path) -> dict:
    found = units("root", str(tmp_path), sys.executable, str(tmp_path / "remote.json"), ENV)
    for name, text in found.items():
        (tmp_path / name).write_text(text)
    return found


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze is not installed here")
def test_systemd_analyze_verify_accepts_both_units(tmp_path):
    written(tmp_path)
    r = subprocess.run(
        ["systemd-analyze", "verify", str(tmp_path / SUPERVISOR_UNIT), str(tmp_path / WATCHDOG_UNIT)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0 and not r.stderr.strip(), r.stderr


def test_the_supervisor_is_restarted_after_a_crash_and_at_boot_and_the_watchdog_always(tmp_path):
    found = written(tmp_path)
    sup, dog = found[SUPERVISOR_UNIT].splitlines(), found[WATCHDOG_UNIT].splitlines()
    for lines in (sup, dog):
        assert "WantedBy=multi-user.target" in lines and "KillMode=control-group" in lines
        assert "StartLimitIntervalSec=0" in lines  # systemd never gives up restarting it
        assert 'Environment="PYTHONPATH=/home/u/orch/code dir"' in lines  # quoted: a space stays in the value
    assert "Restart=on-failure" in sup and "Restart=always" in dog
    assert any(line.startswith("ExecStart=") and '"_supervise"' in line for line in sup)
    assert any(line.startswith("ExecStart=") and '"_watchdog"' in line for line in dog)


def test_the_start_script_is_valid_shell_that_falls_back_to_nohup_and_says_which(tmp_path):
    text = start_script(str(tmp_path), "python3", str(tmp_path / "remote.json"), ENV)
    assert subprocess.run(["sh", "-n"], input=text, text=True).returncode == 0
    assert "sudo -n systemctl enable --now" in text and "echo systemd" in text and "echo nohup" in text
    assert text.count("nohup setsid") == 2  # the watchdog too: it ends the instance even without systemd


def lease(
    instance: str = "i-me", heartbeat: float = 1000.0, ended: float | None = None, final: bool = True
) -> LeaseRecord:
    return LeaseRecord(
        holder=Holder(instance_id=instance), started=900.0, heartbeat=heartbeat, ended=ended, final=final
    )


@pytest.mark.parametrize(
    "record, held, now, started, words",
    [
        (lease(), True, 1010.0, 0.0, ""),  # a live lease of this instance
        (lease(ended=1000.0), True, 1000.0 + ENDED_GRACE_S - 1, 0.0, ""),  # the supervisor's own end goes first
        (lease(ended=1000.0), True, 1000.0 + ENDED_GRACE_S, 0.0, "ended"),
        # released by a crash (not the sweep's end): its supervisor's next controller takes it, so only its lapse ends
        (lease(ended=1000.0, final=False), True, 1000.0 + ENDED_GRACE_S, 0.0, ""),
        (lease(ended=1000.0, final=False), True, 1121.0, 0.0, "lapsed"),
        (lease(ended=1000.0, final=False), True, 1121.0, 1050.0, ""),  # after a reboot: the restart comes first
        (lease(), True, 1121.0, 0.0, "lapsed"),  # 121 s without a heartbeat: the controller is gone
        (lease(), True, 1121.0, 1050.0, ""),  # a watchdog just started (a reboot): the controller may renew first
        (lease("i-other"), True, 1010.0, 0.0, "another controller"),
        (None, False, START_GRACE_S - 1, 0.0, ""),  # still installing
        (lease("i-old", ended=10.0), False, START_GRACE_S, 0.0, "never took"),  # an earlier controller's lease
        (lease(), True, 1010.0 + DEADLINE_GRACE_S, 0.0, "max_hours"),
    ],
)
def test_the_watchdog_ends_the_instance_only_once_nothing_needs_it(record, held, now, started, words):
    deadline = 1010.0 if words == "max_hours" else 1e12
    why = verdict(record, "i-me", held, now, started, deadline)
    assert (words in why) if words else why == "", why
