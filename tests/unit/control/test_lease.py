"""One controller per sweep per store, across machines and ORCH_HOMEs: the lease record `<sweep>/controller.json`."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time

import pytest

from orchestrator.control.lease import (
    READ_S,
    RENEW_S,
    Finished,
    Holder,
    Lease,
    LeaseLost,
    LeaseRecord,
    lease_key,
    read_lease,
    request_stop,
)
from orchestrator.errors import OrchError
from orchestrator.store.base import json_bytes
from orchestrator.wait import retry_until
from tests.conftest import ROOT, Orch, starts
from tests.conftest import run_states as status


def plant(store, sweep: str, holder: Holder, heartbeat: float) -> None:
    """A lease another controller left: written as that controller would have."""
    record = LeaseRecord(holder=holder, started=heartbeat, heartbeat=heartbeat)
    store.put_bytes(lease_key(sweep), json_bytes(record.to_json()))


def test_a_second_controller_from_another_home_is_refused_while_the_first_renews(store, tmp_path):
    first = Lease(store, "sw", tmp_path / "a", "sw.yaml").acquire()
    with pytest.raises(OrchError) as refused:
        Lease(store, "sw", tmp_path / "b", "sw.yaml").acquire()
    text = str(refused.value)
    assert refused.value.exit_code == 2 and f"pid {os.getpid()}" in text and str(tmp_path / "a") in text, text
    assert "orch down sw" in text and "orch status sw --watch" in text and "orch launch sw.yaml" in text, text
    first.renew(force=True)  # the holder keeps renewing over its own writes
    assert read_lease(store, "sw")[0].holder.token == first.holder.token


def test_a_stale_lease_is_taken_over_and_its_old_holder_stops(store, tmp_path):
    old = Lease(store, "sw", tmp_path / "a").acquire()
    gone = Holder(host="laptop-far-away", pid=4242, token="t-old", home="/home/x/.orch")
    plant(store, "sw", gone, time.time() - 3600)  # its heartbeat: an hour ago
    new = Lease(store, "sw", tmp_path / "b").acquire()
    assert new.took_over is not None and new.took_over.holder.host == "laptop-far-away"
    assert read_lease(store, "sw")[0].holder.token == new.holder.token
    with pytest.raises(LeaseLost) as lost:  # a holder that wakes up after its lease was taken stops acting
        old.renew(force=True)
    assert not lost.value.stopped and "took the sweep over" in str(lost.value)


def test_a_lease_of_a_dead_process_on_this_machine_is_taken_over_at_once(store, tmp_path):
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = Holder.here(tmp_path / "a")
    dead.pid = int(proc.stdout)
    plant(store, "sw", dead, time.time())  # a fresh heartbeat, but its process has exited
    assert not read_lease(store, "sw")[0].alive()
    assert Lease(store, "sw", tmp_path / "b").acquire().took_over.holder.pid == dead.pid


def test_racing_controllers_for_a_stale_lease_leave_exactly_one_holder(store, tmp_path):
    plant(store, "sw", Holder(host="elsewhere", pid=1, token="t"), time.time() - 3600)
    won, refused = [], []
    go = threading.Barrier(6)

    def contend(i: int) -> None:
        go.wait()
        try:
            won.append(Lease(store, "sw", tmp_path / f"h{i}").acquire())
        except OrchError:
            refused.append(i)

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and len(refused) == 5, (won, refused)
    assert read_lease(store, "sw")[0].holder.token == won[0].holder.token


def test_a_released_lease_is_free_at_once_and_a_stop_request_ends_the_holder(store, tmp_path):
    first = Lease(store, "sw", tmp_path / "a").acquire()
    first.release("every run is final")
    second = Lease(store, "sw", tmp_path / "b").acquire()
    assert second.took_over is None  # a clean hand-over, not a takeover
    assert request_stop(store, "sw", by="orch down on the laptop") is not None
    with pytest.raises(LeaseLost) as stopped:
        second.renew(force=True)
    assert stopped.value.stopped and "orch down on the laptop" in str(stopped.value)


def test_a_stop_request_reaches_the_holder_within_seconds_not_at_its_next_renewal(store, tmp_path):
    holder = Lease(store, "sw", tmp_path / "a").acquire()
    t0 = time.time()
    holder.renew(now=t0 + 1)  # a pass right after taking it: no write due, nothing read yet (a GET costs)
    assert request_stop(store, "sw", by="orch down elsewhere") is not None
    holder.renew(now=t0 + 2)  # the next pass: the record is read at most every READ_S
    with pytest.raises(LeaseLost) as stopped:
        holder.renew(now=t0 + READ_S)  # seconds later, long before its next heartbeat write is due (RENEW_S)
    assert READ_S < RENEW_S / 3
    assert stopped.value.stopped and "orch down elsewhere" in str(stopped.value)


def test_a_restart_by_the_holders_own_supervisor_takes_the_lease_at_once_and_no_one_else_does(tmp_path):
    """On a remote controller's instance the lease is judged by heartbeat alone; the supervisor starts one controller
    at a time, so a fresh lease under its id belongs to a controller that has exited."""
    from orchestrator.store.folder import LocalStore

    store = LocalStore(str(tmp_path / "store"))
    env = dict(os.environ, ORCH_CONTROLLER_INSTANCE_ID="i-0abc", PYTHONPATH=str(ROOT))
    code = (
        "import sys; from pathlib import Path; from orchestrator.control.lease import Lease; "
        "from orchestrator.store.folder import LocalStore; "
        "Lease(LocalStore(sys.argv[1]), 'sw', Path(sys.argv[2])).acquire(); print('HELD')"
    )

    def controller(supervisor: str, home: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-c", code, store.url, str(tmp_path / home)],
            env=dict(env, ORCH_SUPERVISOR=supervisor),
            capture_output=True,
            text=True,
        )

    assert controller("sup-1", "a").stdout.strip() == "HELD"  # it exits holding a fresh lease (a crash)
    assert read_lease(store, "sw")[0].alive()
    other = controller("sup-2", "b")  # another launch's supervisor: refused while the heartbeat is fresh
    assert "already run by a controller on instance i-0abc" in other.stderr, other.stderr
    again = controller("sup-1", "c")  # its own supervisor's restart
    assert again.stdout.strip() == "HELD", again.stderr
    assert read_lease(store, "sw")[0].holder.home == str(tmp_path / "c")


def test_a_restart_by_its_own_supervisor_does_not_take_a_lease_released_for_good_but_a_new_launch_does(
    store, tmp_path, monkeypatch
):
    """A sweep that ended or was stopped through its lease stays ended when systemd restarts its supervisor; a crash's
    release is taken by the restart; a launch from elsewhere continues the sweep (its own supervisor or none)."""
    monkeypatch.setenv("ORCH_CONTROLLER_INSTANCE_ID", "i-0abc")
    monkeypatch.setenv("ORCH_SUPERVISOR", "sup-1")
    crashed = Lease(store, "sw", tmp_path / "a").acquire()
    crashed.release("the controller's loop ended")  # an unexpected error: the sweep is not over
    stopped = Lease(store, "sw", tmp_path / "b").acquire()  # its supervisor's restart
    assert request_stop(store, "sw", by="orch down on the laptop") is not None
    with pytest.raises(LeaseLost):
        stopped.renew(force=True)
    assert read_lease(store, "sw")[0].final
    with pytest.raises(Finished) as over:  # systemd restarted the supervisor after the stop: nothing starts again
        Lease(store, "sw", tmp_path / "c").acquire()
    assert over.value.exit_code == 0 and "stopped by `orch down` (orch down on the laptop)" in str(over.value)

    monkeypatch.setenv("ORCH_SUPERVISOR", "sup-2")  # a new `orch launch --remote`: the sweep continues
    done = Lease(store, "sw", tmp_path / "d").acquire()
    done.release("every run is final", final=True)
    with pytest.raises(Finished):
        Lease(store, "sw", tmp_path / "e").acquire()
    monkeypatch.delenv("ORCH_SUPERVISOR")  # `orch launch` from a laptop
    assert Lease(store, "sw", tmp_path / "f").acquire().record is not None


def test_an_unreadable_lease_is_taken_over(store, tmp_path):
    store.put_bytes(lease_key("sw"), b'{"holder": {"pid": 3')
    assert read_lease(store, "sw")[0] is None
    Lease(store, "sw", tmp_path / "a").acquire()
    assert read_lease(store, "sw")[0].holder.home == str(tmp_path / "a")


# --- through the CLI: two ORCH_HOMEs on one folder store ----------------------------------------------------


def other_home(orch: Orch, tmp_path) -> Orch:
    """A second user of the same store, tmux server and work folder (`local.workdir`): another ORCH_HOME."""
    other = Orch(tmp_path / "elsewhere")
    other.tmp.mkdir()
    other.socket, other.env["ORCH_TMUX_SOCKET"] = orch.socket, orch.socket
    return other


def controller_pid(orch: Orch, sweep: str) -> int:
    return int((orch.home / "locks" / f"{sweep}.lock").read_text())


@pytest.mark.slow
def test_two_homes_on_one_store_one_controller_and_a_killed_one_is_taken_over(orch, job, tmp_path):
    path = orch.sweep(f"""
        name: shared
        command: "{job(steps=2, release=True)}"
        grid:
          a: [1, 2]
        max_parallel: 2
        store: {orch.store()}
        local:
          workdir: {tmp_path / "work"}
    """)
    assert orch("launch", str(path), "--detach").code == 0
    retry_until(lambda: {r["state"] for r in status(orch, "shared").values()} == {"running"}, 60, 0.3, "both running")
    other = other_home(orch, tmp_path)
    try:
        again = other("launch", str(path))
        assert again.code == 2 and "already run by a controller on" in again.err, again.err
        assert str(orch.home) in again.err and "Traceback" not in again.err, again.err
        seen = other("status", str(path))
        assert "controller: " in seen.out and f"ORCH_HOME {orch.home}" in seen.out, seen.out

        first = controller_pid(orch, "shared")
        os.kill(first, signal.SIGKILL)  # no release: the lease names a process that is gone
        retry_until(lambda: not os.path.exists(f"/proc/{first}"), 10, 0.05, "the controller to exit")
        took = other("launch", str(path), "--detach")
        assert took.code == 0 and "took the sweep over" in took.out, took.out + took.err
        job.release.touch()
        retry_until(
            lambda: {r["state"] for r in status(other, str(path)).values()} == {"succeeded"}, 60, 0.3, "the end"
        )
        runs = status(other, str(path))
        assert [r["attempt"] for r in runs.values()] == [1, 1], runs  # adopted, never restarted
        assert len(starts(job.marks)) == 2 and not (job.marks / "DUPLICATE").exists()
        lease = json.loads(other("status", str(path), "--json").out)["controller"]
        assert lease["ended"] and lease["end_reason"] == "every run is final", lease
    finally:
        other.close()


@pytest.mark.slow
def test_down_from_another_home_stops_the_controller_through_its_lease(orch, job, tmp_path):
    path = orch.sweep(f"""
        name: faraway
        command: "{job(steps=2, release=True)}"
        grid:
          a: [1, 2, 3]
        max_parallel: 2
        store: {orch.store()}
        local:
          workdir: {tmp_path / "work"}
    """)
    assert orch("launch", str(path), "--detach").code == 0
    retry_until(lambda: sum(r["state"] == "running" for r in status(orch, "faraway").values()) == 2, 60, 0.3, "2")
    pid = controller_pid(orch, "faraway")
    other = other_home(orch, tmp_path)
    try:
        d = other("down", str(path))
        assert d.code == 0 and "stopped the controller on" in d.out and "stopped 2 run(s)" in d.out, d.out + d.err
        retry_until(lambda: not os.path.exists(f"/proc/{pid}"), 30, 0.1, "the first home's controller to end")
        states = sorted(r["state"] for r in status(orch, "faraway").values())
        assert states == ["queued", "stopped", "stopped"], states  # nothing started again behind the stop
    finally:
        other.close()


def test_status_names_a_remote_controller_and_says_when_it_went_silent(orch, job):
    from orchestrator.store.folder import LocalStore

    path = orch.sweep(f"""
        name: away
        command: "{job(steps=1)}"
        store: {orch.store()}
    """)
    store = LocalStore(str(orch.store()))
    store.put_bytes("away/sweep.json", b'{"spec": {}}')  # recorded, never run from here
    remote = Holder(host="ip-10-0-0-5", pid=812, token="t", instance_id="i-0abc", instance_type="t3.micro")
    remote.region = "eu-west-1"
    plant(store, "away", remote, time.time() - 5)
    alive = orch("status", str(path))
    assert alive.code == 0 and "controller: instance i-0abc (t3.micro, eu-west-1) pid 812" in alive.out, alive.out
    plant(store, "away", remote, time.time() - 600)
    gone = orch("status", str(path))
    assert re.search(
        r"the one on instance i-0abc \(t3.micro, eu-west-1\) pid 812 is gone \(no heartbeat for 6\d\d s\)", gone.out
    )
    assert f"continue the sweep with `orch launch {path}`" in gone.out, gone.out


def test_an_aws_sweep_held_from_another_home_is_refused_before_anything_is_made(orch, cloud, identity, tmp_path):
    import yaml

    from orchestrator.store.s3 import S3Store
    from tests.conftest import ROOT
    from tests.fakecloud import BUCKET

    spec = yaml.safe_load((ROOT / "experiments" / "fakecloud-smoke.yaml").read_text())
    spec.update(name="held", store=f"s3://{BUCKET}/sweeps")
    spec["aws"]["ssh"].update(identity=str(identity), user=os.environ.get("USER") or "root")
    path = orch.sweep(yaml.safe_dump(spec), name="held.yaml")
    store = S3Store(f"s3://{BUCKET}/sweeps", client=cloud.client("s3"))
    holder = Lease(store, "held", tmp_path / "laptop-home").acquire()  # a live controller of another ORCH_HOME
    r = orch("launch", str(path))
    assert r.code == 2 and "already run by a controller on" in r.err and "Traceback" not in r.err, r.err
    assert "IAM" not in r.err and "quota" not in r.err, r.err
    assert not cloud.all_leftovers()  # no security group, template, profile or instance was made
    assert read_lease(store, "held")[0].holder.token == holder.holder.token


def test_the_refusal_names_a_down_command_that_works_from_the_refused_home(orch, job, tmp_path):
    path = orch.sweep(f"""
        name: refused
        command: "{job(steps=2, release=True)}"
        store: {orch.store()}
        local:
          workdir: {tmp_path / "work"}
    """)
    assert orch("launch", str(path), "--detach").code == 0
    retry_until(lambda: status(orch, "refused").get("run", {}).get("state") == "running", 60, 0.3, "the run")
    other = other_home(orch, tmp_path)
    try:
        r = other("launch", str(path))
        assert r.code == 2 and "already run by a controller on" in r.err, r.err
        told = re.search(r"stop it with `(orch down [^`]+)`", r.err)
        assert told, r.err
        d = other(*shlex.split(told.group(1))[1:])  # as the user types what the message says, in that home
        assert d.code == 0 and "stopped the controller on" in d.out and "stopped 1 run(s)" in d.out, d.out + d.err
    finally:
        other.close()


def test_a_controller_silent_for_a_minute_still_holds_its_sweep_against_a_second_launch(orch, job, tmp_path):
    """Between heartbeat writes (every 15 s), a slow pass or a clock a minute apart: the lease lapses only after
    120 s without one, so a live controller's sweep is never taken from it by a second launch."""
    path = orch.sweep(f"""
        name: slowpass
        command: "{job(steps=2)}"
        store: {orch.store()}
    """)
    from orchestrator.store.folder import LocalStore

    store = LocalStore(str(orch.store()))
    holder = Lease(store, "slowpass", tmp_path / "laptop-home", str(path)).acquire()  # a live controller elsewhere
    record, version = read_lease(store, "slowpass")
    record.heartbeat -= 60  # its last heartbeat a minute ago
    assert store.put_if(lease_key("slowpass"), json_bytes(record.to_json()), version)
    r = orch("launch", str(path))
    ago = re.search(r"last heartbeat (\d+) s ago", r.err)  # 60 s, or a little more on a loaded machine
    assert r.code == 2 and "already run by a controller on" in r.err and ago and 60 <= int(ago[1]) < 120, r.err
    assert read_lease(store, "slowpass")[0].holder.token == holder.holder.token
