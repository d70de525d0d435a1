"""The local backend end to end through the real CLI, on a real tmux server with a private socket: what the README
promises of the local commands (`logs -f`, `status --watch`, `threads_per_run`, `{sweep}`, SWEEP/RUN when two sweeps
share a run id, "lowest *loss" in collect, a second launch of a running sweep, a local `--dry-run`, an agent that goes
silent), `cancel` of a finished run, JSON outputs, and `down --all` beside a sweep that needs absent credentials."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import signal
import stat
import subprocess
import threading

import pytest

from orchestrator.wait import retry_until
from tests.conftest import ENDED_GAP_S, finish, no_traceback, starts
from tests.conftest import run_states as status

pytestmark = pytest.mark.slow


def wait_states(orch, sweep, want, timeout=60):
    """Wait until every run's state is in `want` (a set); returns the last status."""
    last = {}

    def check():
        last.clear()
        last.update(status(orch, sweep))
        return bool(last) and all(r["state"] in want for r in last.values())

    retry_until(check, timeout, 0.3, f"runs of {sweep} to be {want}: {last}")
    return last


def test_launch_status_attach_logs_collect_down(orch, job):
    path = orch.sweep(f"""
        name: flow
        command: "{job(steps=3, release=True)}"
        grid:
          a: [1, 2]
        max_parallel: 2
        store: store
    """)
    r = orch("launch", str(path), "--detach")
    assert r.code == 0, r.err
    assert "background" in r.out
    wait_states(orch, "flow", {"running"})

    table = orch("status", "flow")
    assert table.code == 0 and "a=1" in table.out and "running" in table.out
    overview = orch("status")
    assert "flow (local, controller pid" in overview.out

    # attach: a real terminal, driven through an outer tmux on another socket
    with orch.in_a_terminal("attach", "a=1") as (screen, _):
        retry_until(
            lambda: "tick" in screen() and "of a=1" in screen(), 20, 0.2, "the run's output in the attached terminal"
        )
    assert orch.tmux("has-session", "-t", "=orch_flow_a=1").returncode == 0  # detaching left the run alone

    job.release.touch()
    final = wait_states(orch, "flow", {"succeeded"})
    assert all(r["attempt"] == 1 and r["exit_code"] == 0 for r in final.values())

    logs = orch("logs", "a=2")
    assert logs.code == 0 and "tick 0 of a=2" in logs.out and "finished a=2 with code 0" in logs.out

    out = orch.tmp / "results"
    col = orch("collect", "flow", "--out", str(out))
    assert col.code == 0, col.err
    assert "a=1" in col.out and "wrote" in col.out
    rows = list(csv.DictReader(open(out / "runs.csv")))
    assert [row["run_id"] for row in rows] == ["a=1", "a=2"]
    assert all(row["state"] == "succeeded" and float(row["best_acc"]) > 0.5 for row in rows)
    assert json.loads((out / "runs.json").read_text())["sweep"] == "flow"
    assert (out / "curves.png").read_bytes()[:4] == b"\x89PNG"

    # the store holds what the README says: the run folder as the command left it, orch's records beside it
    run_dir = orch.store("flow", "a=1")
    assert (orch.store("flow", "sweep.json")).exists()
    assert {p.name for p in run_dir.iterdir()} == {"metrics.jsonl"}
    assert orch.store("flow", ".orch", "a=1", "status.json").exists()
    assert orch.store("flow", ".orch", "a=1", "logs", "1.log").exists()

    # a second launch of a finished sweep launches nothing
    before = starts(job.marks)
    again = orch("launch", str(path))
    assert again.code == 0, again.err
    assert "2 of 2 runs succeeded" in again.out
    assert starts(job.marks) == before

    d1, d2 = orch("down", "flow"), orch("down", "flow")
    assert d1.code == d2.code == 0
    assert "nothing of sweep flow is running" in d2.out
    assert not (job.marks / "DUPLICATE").exists()


def test_down_stops_everything_and_launch_resumes(orch, job):
    path = orch.sweep(f"""
        name: stoppy
        command: "{job(steps=2, release=True)}"
        grid:
          a: [1, 2, 3]
        max_parallel: 2
        store: store
    """)
    assert orch("launch", str(path), "--detach").code == 0
    retry_until(
        lambda: sum(r["state"] == "running" for r in status(orch, "stoppy").values()) == 2, 30, 0.3, "2 running"
    )
    d = orch("down", "stoppy")
    assert d.code == 0 and "stopped controller pid" in d.out and "stopped 2 run(s)" in d.out, d.out + d.err
    assert not any(
        s.startswith("orch_stoppy") for s in orch.tmux("list-sessions", "-F", "#{session_name}").stdout.split()
    )
    st = status(orch, "stoppy")
    assert sorted(r["state"] for r in st.values()) == ["queued", "stopped", "stopped"]
    again = orch("down", "stoppy")
    assert again.code == 0 and "nothing of sweep stoppy is running" in again.out

    job.release.touch()
    r = orch("launch", str(path))
    assert r.code == 0, r.out + r.err
    final = status(orch, "stoppy")
    assert all(r["state"] == "succeeded" for r in final.values())
    assert sorted(r["attempt"] for r in final.values()) == [1, 2, 2]
    assert not (job.marks / "DUPLICATE").exists()


def test_controller_killed_mid_sweep_then_relaunched(orch, job):
    path = orch.sweep(f"""
        name: crashy
        command: "{job(steps=15)}"
        grid:
          a: [1, 2, 3, 4, 5, 6]
        max_parallel: 2
        store: store
    """)
    ctl = orch.popen("launch", str(path))
    # kill the controller once some runs finished and others run
    retry_until(
        lambda: sum(r["state"] == "succeeded" for r in status(orch, "crashy").values()) >= 1, 60, 0.2, "a finished run"
    )
    ctl.send_signal(signal.SIGKILL)
    ctl.wait(10)
    mid = status(orch, "crashy", every=True)  # each run's own record: the kill may have come between a claim and the
    # summary of its pass, which then still says the run is queued
    finished_before = {k: v for k, v in mid.items() if v["state"] == "succeeded"}
    snapshot = {k: orch.store("crashy", k, "metrics.jsonl").read_bytes() for k in finished_before}

    r = orch("launch", str(path))
    assert r.code == 0, r.out + r.err
    final = status(orch, "crashy")
    assert all(v["state"] == "succeeded" for v in final.values())
    # no run ran twice at once, and every run ran exactly once: running ones were adopted
    assert not (job.marks / "DUPLICATE").exists()
    assert sorted(run for run, _ in starts(job.marks)) == sorted(final)
    # a run killed between its claim and its start is claimed again as attempt 2: the attempt number fences a claim
    # that may yet start somewhere (on AWS, an instance from a CreateFleet unseen). `orch status` shows such a claim
    # as `lost` when its session was not made yet (an active record without a host), `starting` when it was
    again = {k for k, v in mid.items() if v["state"] in ("starting", "lost")}
    assert all(v["attempt"] == 1 or (k in again and v["attempt"] == 2) for k, v in final.items()), (mid, final)
    assert all(final[k]["attempt"] == 1 for k, v in mid.items() if v["state"] == "running")  # adopted, not restarted
    for k, data in snapshot.items():  # finished results untouched
        assert orch.store("crashy", k, "metrics.jsonl").read_bytes() == data


def test_a_host_that_dies_at_every_attempt_fails_the_run_for_good_not_attempt_after_attempt(orch):
    """Each attempt's session dies at once (as a crashing agent's or host's would): no notice, so not the spot
    market; after a few in a row the run fails with the reason instead of climbing to attempt 78."""
    path = orch.sweep("""
        name: dying
        command: "tmux kill-session"
        store: store
    """)
    r = orch("launch", str(path), timeout=240)
    assert r.code == 1, r.out + r.err
    final = status(orch, "dying")["run"]
    assert (final["state"], final["attempt"], final["failures"]) == ("failed", 5, 0), final
    assert "5 attempts in a row were lost within 10 min of their start" in final["reason"], final
    assert "5 attempts in a row were lost" in r.out and "Traceback" not in r.out + r.err


def test_failing_command_retried_then_reported(orch, job):
    path = orch.sweep(f"""
        name: faily
        command: "{job(steps=2, code=3)}"
        max_restarts: 2
        store: store
    """)
    r = orch("launch", str(path))
    assert r.code == 1
    assert "run run failed after 3 attempt(s): exit code 3" in r.out
    assert "finished run with code 3" in r.out  # the log's tail
    final = status(orch, "faily")["run"]
    assert final["state"] == "failed" and final["exit_code"] == 3 and final["failures"] == 3 and final["attempt"] == 3
    assert len(starts(job.marks)) == 3
    # a relaunch does not retry a run that used up its restarts
    assert orch("launch", str(path)).code == 1
    assert len(starts(job.marks)) == 3


def test_cancel_stops_the_command_and_timeout_fails_it(orch, job):
    path = orch.sweep(f"""
        name: cancelly
        command: "{job(steps=1, release=True)}"
        max_restarts: 0
        store: store
    """)
    assert orch("launch", str(path), "--detach").code == 0
    wait_states(orch, "cancelly", {"running"})
    # the job holds its lock while it runs (the record says `running` as its window opens: the command's first line
    # may come a moment later)
    retry_until(lambda: (job.marks / "run.running").exists(), 60, 0.1, "the command to hold its lock")
    c = orch("cancel", "cancelly/run")
    assert c.code == 0 and "cancelled cancelly/run" in c.out
    assert status(orch, "cancelly")["run"]["state"] == "cancelled"
    assert not (job.marks / "run.running").exists()  # its SIGTERM handler ran: cancel stopped the command
    assert "finished run" not in orch("logs", "cancelly/run").out
    assert orch.tmux("has-session", "-t", "=orch_cancelly_run").returncode != 0
    timed = orch.sweep(
        """
        name: timely
        command: "sleep 60"
        max_restarts: 0
        timeout_minutes: 0.05
        store: store
    """,
        name="t.yaml",
    )
    assert orch("launch", str(timed), timeout=120).code == 1
    v = status(orch, "timely")["run"]
    assert v["state"] == "failed" and "timed out after 3 s" in v["reason"]


def test_unknown_run_and_sweep_are_clear_errors(orch):
    for args in (["attach", "nope"], ["logs", "nope"], ["status", "nope"], ["collect", "nope"], ["down", "nope"]):
        r = orch(*args)
        assert r.code == 2 and "Traceback" not in r.err and "nope" in r.err, (args, r.err)


def test_help_has_examples(orch):
    for cmd in ("launch", "status", "attach", "logs", "collect", "cancel", "down"):
        r = orch(cmd, "--help")
        assert r.code == 0 and "Example:" in r.out and "orch " in r.out, cmd


COLLECT_COLUMNS = (  # every column `orch collect` writes besides params and metrics (run_id is refused as a name)
    "state",
    "attempts",
    "reason",
    "elapsed_s",
    "cost_usd",
    "gpu_hours",
    "reached",
    "time_to_target_s",
    "wall_to_target_s",
    "usd_to_target",
    "trial_value",
    "best_test_acc",
)


def test_a_param_named_like_one_of_collects_columns_never_overwrites_it(orch, tmp_path):
    """README (orch collect): a param named like one of collect's own columns is kept as `param.<name>`, as a metric
    is kept as `metric.<name>`: `state` says the run's state, `attempts` its attempts, whatever the params are named."""
    import sys

    script = tmp_path / "job.py"
    script.write_text(
        'import os\nopen(os.environ["ORCH_RUN_DIR"] + "/metrics.jsonl", "a").write(\'{"test_acc": 0.75}\\n\')\n'
    )
    space = "\n".join(f"    {name}: {{choices: [p_{name}]}}" for name in COLLECT_COLUMNS)
    path = orch.sweep(
        f"name: columns\ncommand: {sys.executable} {script}\nstore: store\ntarget: {{metric: test_acc, value: 0.5}}\n"
        f"search:\n  sampler: random\n  trials: 1\n  space:\n{space}\n"
    )
    r = orch("launch", str(path))
    assert r.code == 0, r.out + r.err
    c = orch("collect", "columns", "--out", str(tmp_path / "res"), "--wide")
    assert c.code == 0, c.out + c.err
    (row,) = list(csv.DictReader(open(tmp_path / "res" / "runs.csv")))
    (js,) = json.loads((tmp_path / "res" / "runs.json").read_text())["runs"]
    for name in COLLECT_COLUMNS:
        assert row[f"param.{name}"] == f"p_{name}" and js[f"param.{name}"] == f"p_{name}", (name, row)
        assert js.get(name) != f"p_{name}" and row.get(name) != f"p_{name}", (name, row)
    assert js["state"] == "succeeded" and js["attempts"] == 1 and js["reason"] == "" and js["reached"] is True
    assert js["trial_value"] == 0.75 and js["best_test_acc"] == 0.75 and isinstance(js["elapsed_s"], float)
    assert "succeeded" in c.out and "p_state" in c.out  # the table too: the run's state, and the param beside it


def test_megabytes_of_text_in_a_metrics_line_are_cut_for_display_in_launch_status_and_collect(orch, tmp_path):
    """A 3 MB string once made `orch status` print 115,391 lines (the table folds a cell to its width): tables and
    lines show names and values cut to one short line; runs.csv keeps names whole."""
    import sys

    script = tmp_path / "job.py"
    script.write_text(
        "import json, os\n"
        'with open(os.environ["ORCH_RUN_DIR"] + "/metrics.jsonl", "a") as f:\n'
        '    f.write(json.dumps({"epoch": 1, "note": "x\\n" * 1_500_000, "loss": 0.5}) + "\\n")\n'
        '    f.write(json.dumps({"epoch": 2, "note": "y" * 3_000_000, "z" * 100_000: 1.0, "loss": 0.4}) + "\\n")\n'
    )
    path = orch.sweep(f"name: big\ncommand: {sys.executable} {script}\nstore: store\n")
    shown = [orch("launch", str(path)), orch("status", "big"), orch("collect", "big", "--out", str(tmp_path / "res"))]
    for r in shown:
        assert r.code == 0, r.err
        assert len(r.out.splitlines()) < 30 and len(r.out) < 5000, r.out[:3000]
    assert "loss=0.4" in shown[1].out and "yyyy…" in shown[1].out
    (row,) = list(csv.DictReader(open(tmp_path / "res" / "runs.csv")))
    assert row["z" * 100_000] == "1.0"  # the results keep the name whole


def test_cancelling_a_finished_run_changes_nothing(orch):
    path = orch.sweep("name: done1\ncommand: 'true'\nstore: store\n")
    assert finish(orch, path).code == 0
    before = status(orch, "done1")["run"]
    r = orch("cancel", "run")
    no_traceback(r)
    assert "already succeeded" in r.out + r.err
    after = status(orch, "done1")["run"]
    assert after["state"] == "succeeded" and after["elapsed"] == before["elapsed"]


def test_json_outputs_are_json_and_scripts_are_private(orch, tmp_path):
    path = orch.sweep("""
        name: nan
        command: "echo '{{\\"step\\": 1, \\"loss\\": NaN, \\"acc\\": Infinity}}' >> $ORCH_RUN_DIR/metrics.jsonl"
        store: store
    """)
    assert finish(orch, path).code == 0
    json.loads(orch("status", "nan", "--json").out, parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))
    assert orch("collect", "nan", "--out", str(tmp_path / "res")).code == 0
    json.loads((tmp_path / "res" / "runs.json").read_text(), parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))
    scripts = list((orch.home / "work" / "nan").rglob("attempt-*.sh"))
    assert scripts and all(stat.S_IMODE(s.stat().st_mode) == 0o600 for s in scripts)


def test_down_all_and_status_reach_every_sweep_when_one_needs_absent_aws_credentials(orch, job):
    from orchestrator.control.state import State

    path = orch.sweep(f"""
        name: b-local
        command: "{job(steps=2, release=True)}"
        store: store
    """)
    assert orch("launch", str(path), "--detach").code == 0
    retry_until(lambda: status(orch, "b-local").get("run", {}).get("state") == "running", 30, 0.2, "the run to start")
    # a sweep launched on AWS from here earlier (first in the alphabet), and a shell without AWS credentials
    State(orch.home).remember("a-aws", str(orch.tmp / "gone.yaml"), "s3://some-bucket/sweeps", "aws")
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        orch.env.pop(key, None)
    orch.env.update(
        AWS_CONFIG_FILE=os.devnull,
        AWS_SHARED_CREDENTIALS_FILE=os.devnull,
        AWS_EC2_METADATA_DISABLED="true",
        AWS_ENDPOINT_URL="http://127.0.0.1:9",
    )
    s = orch("status")
    assert s.code == 0 and "b-local (local, controller pid" in s.out and "1 running" in s.out, s.out + s.err
    assert "a-aws (aws): unreadable: No AWS credentials found" in s.out, s.out
    d = orch("down", "--all")
    no_traceback(d)
    assert d.code == 1 and "stopped 1 run(s): run" in d.out, d.out + d.err
    assert "a-aws: not stopped: No AWS credentials found" in d.err and "(a-aws)" in d.err, d.err
    assert status(orch, "b-local")["run"]["state"] == "stopped"
    assert (orch.home / "locks" / "b-local.lock").read_text() and "controller pid" not in orch("status").out


PROBE = """
import json, os
out = os.environ["ORCH_RUN_DIR"]
import sys
print("threads", os.environ["OMP_NUM_THREADS"], "sweep", sys.argv[1], os.environ["ORCH_SWEEP"], flush=True)
with open(os.path.join(out, "metrics.jsonl"), "a") as f:
    for step, (loss, acc) in enumerate([(3.0, 0.1), (1.0, 0.9), (2.0, 0.5)]):
        f.write(json.dumps({"step": step, "val_loss": loss, "val_acc": acc}) + "\\n")
"""


def running(orch, job, name: str):
    """A one-run sweep of the release job, launched in the background and running; returns its file."""
    path = orch.sweep(
        f"""
        name: {name}
        command: "{job(steps=2, release=True)}"
        store: store
    """,
        name=f"{name}.yaml",
    )
    assert orch("launch", str(path), "--detach").code == 0
    retry_until(lambda: status(orch, name).get("run", {}).get("state") == "running", 60, 0.3, "the run to start")
    return path


def test_logs_follow_and_status_watch_run_until_the_sweep_ends(orch, job):
    running(orch, job, "follow")
    logs = orch.popen("logs", "run", "-f")
    watch = orch.popen("status", "follow", "--watch")
    seen: list = []
    reader = threading.Thread(target=lambda: seen.extend(iter(watch.stdout.readline, "")), daemon=True)
    reader.start()
    store_log = orch.store("follow", ".orch", "run", "logs", "1.log")
    retry_until(lambda: store_log.exists() and "tick 3" in store_log.read_text(), 60, 0.3, "the log to reach the store")
    # the watch has shown the run running before it may end (on a loaded machine its start can take seconds)
    retry_until(
        lambda: any("run: running (attempt 1)" in line for line in list(seen)),
        120,
        0.2,
        "the watch to show the run running",
    )
    assert logs.poll() is None and watch.poll() is None  # both keep following a running sweep
    job.release.touch()
    out_logs = logs.communicate(timeout=90)[0]
    watch.wait(timeout=90)
    reader.join(timeout=30)
    out_watch = "".join(seen)
    assert logs.returncode == 0 and "tick 0 of run" in out_logs and "finished run with code 0" in out_logs, out_logs
    assert watch.returncode == 0, out_watch
    assert "run: running (attempt 1)" in out_watch and "run: succeeded (attempt 1)" in out_watch, out_watch


def test_threads_per_run_ambiguous_run_ids_and_lowest_loss(orch, script):
    probe = script(PROBE, "probe.py")
    one = orch.sweep(
        f"""
        name: pinned
        command: "{{python}} {probe} {{sweep}}"
        store: store
        local:
          threads_per_run: 3
    """,
        "one.yaml",
    )
    two = orch.sweep(
        f"""
        name: shared
        command: "{{python}} {probe} {{sweep}}"
        max_parallel: 2
        store: store
    """,
        "two.yaml",
    )
    orch.env["OMP_NUM_THREADS"] = "7"  # the shell's value yields to the sweep's threads_per_run
    r = orch("launch", str(one))
    assert r.code == 0, r.out + r.err
    orch.env.pop("OMP_NUM_THREADS")  # and without one in the shell, the default is cores / max_parallel
    r = orch("launch", str(two))
    assert r.code == 0, r.out + r.err

    # both sweeps have a run called "run": the bare id is ambiguous, SWEEP/RUN is not
    r = orch("logs", "run")
    assert r.code != 0 and "pinned/run" in r.err and "shared/run" in r.err and "Traceback" not in r.err, r.err
    pinned, shared = orch("logs", "pinned/run"), orch("logs", "shared/run")
    assert "threads 3 sweep pinned pinned" in pinned.out, pinned.out
    default = max(1, (os.cpu_count() or 1) // min(2, os.cpu_count() or 1))  # cores / max_parallel
    assert f"threads {default} sweep shared shared" in shared.out, shared.out

    out = orch.tmp / "results"
    assert orch("collect", "pinned", "--out", str(out)).code == 0
    row = next(csv.DictReader(open(out / "runs.csv")))
    assert float(row["best_val_loss"]) == 1.0 and float(row["best_val_acc"]) == 0.9, row  # not the last values


def test_a_second_launch_of_a_running_sweep_launches_nothing(orch, job):
    path = running(orch, job, "twice")
    again = orch("launch", str(path))
    # exit 2, as a second launch refused by the lease (docs/guides/unattended.md): the same refusal, nearer home
    assert again.code == 2 and "already being run by controller pid" in again.err and "Traceback" not in again.err, (
        again.err
    )
    dry = orch("launch", str(path), "--dry-run")
    assert dry.code == 0 and "nothing launched" in dry.out, dry.err
    job.release.touch()
    retry_until(
        lambda: status(orch, "twice", gap=ENDED_GAP_S)["run"]["state"] == "succeeded", 60, 0.3, "the run to end"
    )
    assert len(starts(job.marks)) == 1 and not (job.marks / "DUPLICATE").exists()


def test_local_dry_run_lists_runs_and_starts_nothing(orch, job):
    path = orch.sweep(f"""
        name: dry
        command: "{job(steps=1)} --lr {{lr}}"
        grid:
          lr: [0.1, 0.2]
        store: store
    """)
    r = orch("launch", str(path), "--dry-run")
    assert r.code == 0, r.err
    assert "lr=0.1" in r.out and "lr=0.2" in r.out and "--lr 0.2" in r.out and "nothing launched" in r.out, r.out
    assert orch.tmux("has-session").returncode != 0  # no tmux server, so no run
    assert not orch.store("dry").exists() and starts(job.marks) == []
    assert "dry" not in orch("status").out


def test_an_agent_that_goes_silent_loses_its_host_and_the_run_restarts(orch, job):
    """The local backend's stale limit (30 s) end to end: the agent is stopped (SIGSTOP), the
    controller calls the host lost, stops what is left of the attempt, and starts attempt 2."""
    running(orch, job, "silent")
    agent_pid = int((orch.home / "work" / "silent" / "run" / "ctl" / "agent.pid").read_text())
    os.kill(agent_pid, signal.SIGSTOP)
    try:
        retry_until(lambda: status(orch, "silent")["run"]["attempt"] == 2, 120, 1.0, "attempt 2 after the stale limit")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(agent_pid, signal.SIGCONT)
    # the old agent, woken up, finds its record taken over: it writes nothing (one writer per record) and exits
    retry_until(
        lambda: subprocess.run(["kill", "-0", str(agent_pid)], capture_output=True).returncode != 0,
        60,
        0.5,
        "the woken agent to exit",
    )
    v = status(orch, "silent")["run"]
    assert (v["state"], v["attempt"], v["preemptions"], v["failures"]) == ("running", 2, 1, 0), v
    job.release.touch()
    retry_until(
        lambda: status(orch, "silent", gap=ENDED_GAP_S)["run"]["state"] == "succeeded", 90, 0.5, "attempt 2 to finish"
    )
    assert [a for _, a in starts(job.marks)] == ["1", "2"]
    assert not (job.marks / "DUPLICATE").exists()  # attempt 1's command was stopped before attempt 2 began
