"""`orch launch` as process control (control/launch.py): the lock, the lease, signals and the hand-off to a
background controller, a stop by `orch down` — driven without click (a real process runs `Launch` and sends itself
real signals), and through `orch launch` where the README makes the promise: SIGINT, SIGTERM or SIGHUP hand the loop
over, `orch down` during a foreground launch hands nothing over, status says when no controller runs, and a sweep of
the same name on another store is refused."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from orchestrator.control.state import SweepLock
from orchestrator.wait import retry_until
from tests.conftest import Orch, finish, no_traceback, starts
from tests.conftest import run_states as status
from tests.unit.control.test_lease import other_home

# A launch without the CLI: Launch.run in a process of its own (it installs signal handlers and may end the process),
# each event one line on stdout. argv: the sweep file, and the event at which the process sends itself a signal.
DRIVER = textwrap.dedent("""
    import dataclasses, json, os, signal, sys
    from orchestrator.backends.registry import backend_for, load_sweep
    from orchestrator.control import launch as control
    from orchestrator.control.state import State
    from orchestrator.store import open_store

    sweep = load_sweep(sys.argv[1])
    signal_at, sig = sys.argv[2], getattr(signal, sys.argv[3])

    def tell(event):
        print("EVENT", type(event).__name__, json.dumps(dataclasses.asdict(event)), flush=True)
        if type(event).__name__ == signal_at:
            os.kill(os.getpid(), sig)

    def watch(run_fn):
        return run_fn(lambda progress: None)

    launch = control.Launch(sweep, backend_for(sweep), open_store(sweep.store_url), State(), tell)
    progress = launch.run(detach=False, watch=watch)
    print("RETURNED", None if progress is None else len(progress.failed), flush=True)
""")


def drive(orch: Orch, path, signal_at: str = "", sig: str = "SIGTERM", timeout: float = 120) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(path), signal_at, sig],
        env=orch.env,
        cwd=orch.tmp,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def events(out: str) -> list:
    return [line.split()[1] for line in out.splitlines() if line.startswith("EVENT ")]


def all_succeeded(orch: Orch, name: str, n: int) -> bool:
    runs = status(orch, name)
    return len(runs) == n and all(r["state"] == "succeeded" for r in runs.values())


def test_a_launch_without_the_cli_runs_the_sweep_to_its_end(orch, job):
    path = orch.sweep(f"""
        name: plain
        command: "{job(steps=2)}"
        grid:
          a: [1, 2]
        max_parallel: 2
        store: store
    """)
    p = drive(orch, path)
    out = p.communicate(timeout=120)[0]
    assert p.returncode == 0 and events(out) == ["Started"] and "RETURNED 0" in out, out
    assert SweepLock(orch.home, "plain").holder() is None


def test_a_signal_right_after_the_start_hands_the_loop_to_a_background_controller_that_is_not_refused(orch, job):
    """SIGTERM (or a closed terminal) the moment the sweep starts, before the loop's first pass: the launch's own
    lease is released with the hand-off, so the background controller takes the sweep and runs it."""
    path = orch.sweep(f"""
        name: early
        command: "{job(steps=2)}"
        grid:
          a: [1, 2, 3]
        max_parallel: 1
        store: store
    """)
    p = drive(orch, path, signal_at="Started", sig="SIGHUP")
    out = p.communicate(timeout=60)[0]
    assert p.returncode == 0 and events(out) == ["Started", "HandedOff"] and "RETURNED None" in out, out
    retry_until(lambda: all_succeeded(orch, "early", 3), 120, 0.5, "the background controller to run every run")
    log = (orch.home / "logs" / "early-controller.log").read_text()
    assert "already run by a controller" not in log, log


def test_sigterm_as_orch_launch_says_it_started_still_hands_the_sweep_over(orch, job):
    """The same through `orch launch`: the signal comes as soon as "launching sweep" is printed (twice: the window
    is short)."""
    for attempt in (1, 2):
        name = f"justnow{attempt}"
        path = orch.sweep(
            f"""
            name: {name}
            command: "{job(steps=2)}"
            grid:
              a: [1, 2]
            max_parallel: 1
            store: store
        """,
            name=f"{name}.yaml",
        )
        p = orch.popen("launch", str(path))
        for line in p.stdout:
            if "launching sweep" in line:
                p.send_signal(signal.SIGTERM)
                break
        out = p.communicate(timeout=60)[0]
        assert p.returncode == 0 and "detached" in out and "Traceback" not in out, out
        retry_until(lambda: all_succeeded(orch, name, 2), 120, 0.5, "the background controller to run every run")
        log = (orch.home / "logs" / f"{name}-controller.log").read_text()
        assert "already run by a controller" not in log, log


def test_a_launch_stopped_through_its_lease_from_another_home_exits_143(orch, job, tmp_path):
    """`orch down` from another ORCH_HOME reaches the launch through the lease: it ends as a stop (143), promptly,
    and hands nothing over."""
    path = orch.sweep(f"""
        name: leased
        command: "{job(steps=2, release=True)}"
        grid:
          a: [1, 2, 3]
        max_parallel: 2
        store: {orch.store()}
        local:
          workdir: {tmp_path / "work"}
    """)
    p = drive(orch, path)
    retry_until(lambda: sum(r["state"] == "running" for r in status(orch, "leased").values()) == 2, 60, 0.3, "2 runs")
    other = other_home(orch, tmp_path)
    try:
        d = other("down", str(path))
        assert d.code == 0 and "stopped the controller on" in d.out, d.out + d.err
        out = p.communicate(timeout=60)[0]
        assert p.returncode == 143 and events(out) == ["Started", "Stopped"], out
        assert "stopped by `orch down`" in out and "RETURNED" not in out, out
        assert SweepLock(orch.home, "leased").holder() is None  # nothing took the loop over
        assert sorted(r["state"] for r in status(orch, "leased").values()) == ["queued", "stopped", "stopped"]
    finally:
        other.close()


def test_orch_launch_stopped_through_its_lease_exits_143(orch, job, tmp_path):
    path = orch.sweep(f"""
        name: leasedcli
        command: "{job(steps=2, release=True)}"
        grid:
          a: [1, 2]
        max_parallel: 1
        store: {orch.store()}
        local:
          workdir: {tmp_path / "work"}
    """)
    p = orch.popen("launch", str(path))
    retry_until(lambda: status(orch, "leasedcli").get("a=1", {}).get("state") == "running", 60, 0.3, "the first run")
    other = other_home(orch, tmp_path)
    try:
        d = other("down", str(path))
        assert d.code == 0 and "stopped the controller on" in d.out, d.out + d.err
        out = p.communicate(timeout=60)[0]
        assert p.returncode == 143 and "stopped by `orch down`" in out, out
        assert "background" not in out and "Traceback" not in out, out
    finally:
        other.close()


def test_a_detached_launch_after_down_runs_the_sweep_again(orch, job):
    """`orch down` leaves a stop mark for a hand-off it may cross; the next launch removes it, also when that
    launch goes straight to the background (--detach), whose controller reads the mark."""
    path = orch.sweep(f"""
        name: again
        command: "{job(steps=2, release=True)}"
        grid:
          a: [1, 2]
        max_parallel: 2
        store: store
    """)
    assert orch("launch", str(path), "--detach").code == 0
    retry_until(lambda: sum(r["state"] == "running" for r in status(orch, "again").values()) == 2, 60, 0.3, "2 runs")
    d = orch("down", "again")
    assert d.code == 0 and "stopped 2 run(s)" in d.out, d.out + d.err
    job.release.touch()
    r = orch("launch", str(path), "--detach")
    assert r.code == 0 and "controller running in the background" in r.out, r.out + r.err
    retry_until(lambda: all_succeeded(orch, "again", 2), 120, 0.5, "the relaunched sweep to end")
    assert [a for _, a in starts(job.marks)] == ["1", "1", "2", "2"]


def test_down_by_name_in_the_first_seconds_of_an_aws_launch_finds_the_sweep_and_leaves_nothing(orch, cloud, identity):
    """Preflight makes the security group, the template and the profile (seconds on AWS) before the store has the
    sweep's record: `orch down NAME` then already knows the sweep, stops the launch and removes what it made."""
    import threading

    import yaml

    from tests.conftest import ROOT
    from tests.fakecloud import BUCKET

    spec = yaml.safe_load((ROOT / "experiments" / "fakecloud-smoke.yaml").read_text())
    spec.update(name="early-aws", store=f"s3://{BUCKET}/sweeps")
    spec["aws"]["ssh"].update(identity=str(identity), user=os.environ.get("USER") or "root")
    path = orch.sweep(yaml.safe_dump(spec), name="early-aws.yaml")
    release = cloud.gate.hold["CreateLaunchTemplate"] = threading.Event()
    try:
        p = orch.popen("launch", str(path))
        retry_until(lambda: "CreateLaunchTemplate" in cloud.gate.held, 120, 0.2, "preflight to ask for the template")
        d = orch("down", "early-aws")
        assert d.code == 0 and "Traceback" not in d.err, d.out + d.err
        out = p.communicate(timeout=60)[0]
        assert p.returncode != 0 and "Traceback" not in out, out  # stopped in its preflight: nothing runs
    finally:
        release.set()
    assert not any(cloud.leftovers("early-aws").values()), cloud.leftovers("early-aws")


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])  # Ctrl-C, kill, a closed terminal
def test_sigterm_or_sighup_hands_the_loop_over(orch, job, sig):
    path = orch.sweep(f"""
        name: hup{int(sig)}
        command: "{job(steps=3, release=True)}"
        grid:
          a: [1, 2, 3]
        max_parallel: 1
        store: store
    """)
    name = f"hup{int(sig)}"
    # as from a terminal: a shell's background job (e.g. a CI runner's) starts with SIGINT ignored,
    # and Python then never raises KeyboardInterrupt; a foreground `orch launch` has it
    p = orch.popen("launch", str(path), preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    retry_until(lambda: status(orch, name).get("a=1", {}).get("state") == "running", 30, 0.2, "the first run")
    p.send_signal(sig)
    out = p.communicate(timeout=30)[0]
    assert "background" in out and "Traceback" not in out, out
    job.release.touch()
    retry_until(
        lambda: all(v["state"] == "succeeded" for v in status(orch, name).values()), 90, 0.5, "queued runs to finish"
    )


@pytest.mark.slow
def test_down_during_a_foreground_launch_stops_it_and_hands_nothing_over(orch, job):
    from orchestrator.control.state import SweepLock

    path = orch.sweep(f"""
        name: downfg
        command: "{job(steps=3, release=True)}"
        grid:
          a: [1, 2, 3]
        max_parallel: 2
        store: store
    """)
    p = orch.popen("launch", str(path), preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    retry_until(
        lambda: all(status(orch, "downfg").get(f"a={a}", {}).get("state") == "running" for a in (1, 2)),
        30,
        0.2,
        "two runs",
    )
    d = orch("down", "downfg")
    assert d.code == 0 and "stopped 2 run(s)" in d.out, d.out + d.err
    out = p.communicate(timeout=60)[0]
    assert "stopped by `orch down downfg`" in out and "background" not in out and "Traceback" not in out, out
    assert SweepLock(orch.home, "downfg").holder() is None  # no controller took the loop over
    states = {rid: v["state"] for rid, v in status(orch, "downfg").items()}
    assert states == {"a=1": "stopped", "a=2": "stopped", "a=3": "queued"}, states
    assert orch.tmux("list-sessions").stdout == ""  # nothing runs
    # a background controller started by a hand-off that crossed the stop starts nothing either
    r = orch("_controller", str(path))
    assert r.code == 0 and "stopped by `orch down`" in r.out, r.out + r.err
    assert sorted(a for _, a in starts(job.marks)) == ["1", "1"]
    job.release.touch()
    assert orch("launch", str(path), timeout=120).code == 0  # a launch after the down continues the sweep
    assert all(v["state"] == "succeeded" for v in status(orch, "downfg").values())


@pytest.mark.slow
def test_status_says_when_no_controller_runs(orch, job):
    path = orch.sweep(f"""
        name: orphaned
        command: "{job(steps=2, release=True)}"
        grid:
          a: [1, 2]
        max_parallel: 1
        store: store
    """)
    assert orch("launch", str(path), "--detach").code == 0
    retry_until(lambda: status(orch, "orphaned").get("a=1", {}).get("state") == "running", 30, 0.2, "the first run")
    os.kill(int((orch.home / "locks" / "orphaned.lock").read_text()), signal.SIGKILL)
    r = orch("status", "orphaned")
    assert "no controller" in r.out and f"orch launch {path}" in r.out, r.out
    job.release.touch()
    orch("down", "orphaned")


@pytest.mark.slow
def test_same_name_other_store_is_refused(orch):
    assert finish(orch, orch.sweep("name: twin\ncommand: 'true'\nstore: store\n", name="a.yaml")).code == 0
    r = orch("launch", str(orch.sweep("name: twin\ncommand: 'true'\nstore: other\n", name="b.yaml")))
    no_traceback(r)
    assert r.code != 0 and "twin" in r.err and "store" in r.err, r.err
