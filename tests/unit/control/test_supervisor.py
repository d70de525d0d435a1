"""The remote controller's supervisor (control/supervisor.py) with real controllers: each a child process of
`orch _controller`, here one that crashes at start (its remote settings unreadable)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.control import supervisor
from orchestrator.control.supervisor import GONE, MAX_RESTARTS, Supervisor
from orchestrator.store.folder import LocalStore
from orchestrator.store.layout import controller_log_key

ROOT = Path(__file__).resolve().parents[3]


@dataclass
class _Settings:
    sweep_file: str
    code_dir: str = str(ROOT)
    instance_id: str = "i-0supervised"
    instance_type: str = "t3.small"
    region: str = "us-east-1"
    deadline: float = field(default_factory=lambda: time.time() + 600)
    notify_env: dict = field(default_factory=dict)


def test_a_controller_that_keeps_crashing_is_restarted_max_restarts_times_then_the_instance_ends(tmp_path, monkeypatch):
    monkeypatch.setattr(supervisor.time, "sleep", lambda s: None)  # the backoff between restarts (75 s in all)
    monkeypatch.chdir(tmp_path)
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text('name: sv\ncommand: "true"\nstore: store\n')
    (tmp_path / "remote.json").write_text("{not json")  # every controller crashes (exit 1) as it starts
    store, ended = LocalStore(str(tmp_path / "store")), []
    sup = Supervisor(_Settings(str(sweep)), "sv", store, tmp_path / "controller.log", terminate=ended.append)
    ending = sup.run()
    log = store.get_bytes(controller_log_key("sv")).decode()
    assert ending.reason.startswith(GONE) and ending.restarts == MAX_RESTARTS + 1, ending
    assert log.count("JSONDecodeError") == MAX_RESTARTS + 1, log[-3000:]  # the first start and MAX_RESTARTS more
    assert f"restart {MAX_RESTARTS} of {MAX_RESTARTS}" in log and ended == ["i-0supervised"], log[-3000:]


def test_a_refused_controller_is_not_restarted_and_the_instance_ends(tmp_path, monkeypatch):
    """Exit 2 (the sweep is wrong, or another controller holds it): starting it again changes nothing."""
    monkeypatch.setattr(supervisor.time, "sleep", lambda s: None)
    monkeypatch.chdir(tmp_path)
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text('name: sv\ncommand: "true"\nstore: store\nbogus: 1\n')  # refused: exit 2
    (tmp_path / "remote.json").write_text("{}")
    store, ended = LocalStore(str(tmp_path / "store")), []
    sup = Supervisor(_Settings(str(sweep)), "sv", store, tmp_path / "controller.log", terminate=ended.append)
    ending = sup.run()
    log = store.get_bytes(controller_log_key("sv")).decode()
    assert "refused" in ending.reason and ending.restarts == 0, ending
    assert log.count("Extra inputs are not permitted") == 1 and "restart 1 of" not in log, log[-3000:]
    assert ended == ["i-0supervised"]
