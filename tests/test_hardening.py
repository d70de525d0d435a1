"""Bad inputs and hostile commands, from an adversarial trial: each numbered case of the hardening
issue reproduced through the real CLI (real tmux, real store) — none may print a traceback."""

from __future__ import annotations

import json
import os
import signal
import stat
import time

import pytest

from orchestrator.wait import retry_until
from tests.conftest import ENDED_GAP_S, starts
from tests.conftest import run_states as status

pytestmark = pytest.mark.slow

METACHARS = [
    "`touch {m}/bt`",
    "$(touch {m}/dollar)",
    "a; touch {m}/semi",
    'it\'s "quoted"',
    "back\\slash",
    "two\nlines",
    "trail\\",
]


def no_traceback(r):
    assert "Traceback" not in r.out + r.err, r.out + r.err


def finish(orch, path, timeout=120):
    r = orch("launch", str(path), timeout=timeout)
    no_traceback(r)
    return r


# --- shell safety -------------------------------------------------------------------------


def test_shell_metacharacters_in_params_env_and_commands_stay_data(orch, tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    values = [v.format(m=marks) for v in METACHARS]
    path = orch.sweep(
        json.dumps(
            {
                "name": "meta",
                "command": "printf '<%s>\\n' {c} \"$V\"; echo 'cmd `touch " + str(marks) + "/incmd` ok'",
                "grid": {"c": values},
                "env": {"V": f"$(touch {marks}/env)`touch {marks}/env2`"},
                "max_parallel": 4,
                "store": "store",
            }
        )
    )
    r = finish(orch, path)
    assert r.code == 0, r.out + r.err
    assert list(marks.iterdir()) == []  # nothing ran
    for run_id in status(orch, "meta"):
        log = orch("logs", run_id).out
        assert f"$(touch {marks}/env)`touch {marks}/env2`" in log and "cmd `touch" in log
    logs = "".join(orch("logs", r).out for r in status(orch, "meta"))
    for v in values:
        assert f"<{v}>" in logs, v


def test_a_command_that_cannot_parse_is_a_failed_attempt_with_its_error(orch):
    path = orch.sweep("""
        name: broken
        command: "echo 'unterminated"
        max_restarts: 0
        store: store
    """)
    r = finish(orch, path)
    assert r.code == 1
    v = status(orch, "broken")["run"]
    assert v["state"] == "failed" and v["exit_code"] not in (None, 0)
    assert "unexpected EOF" in orch("logs", "run").out
    path = orch.sweep("name: trailing\ncommand: 'echo hi \\'\nmax_restarts: 0\nstore: store\n", name="t.yaml")
    finish(orch, path)
    assert status(orch, "trailing")["run"]["state"] == "succeeded"  # bash takes a trailing backslash literally (exit 0)
    assert "hi \\" in orch("logs", "trailing/run").out


def test_env_keys_must_be_identifiers(orch, tmp_path):
    marker = tmp_path / "envkey-ran"
    path = orch.sweep(json.dumps({"name": "envkey", "command": "true", "env": {f"A;touch {marker};B": "1"}}))
    r = orch("launch", str(path))
    assert r.code == 2 and "env" in r.err and "letters, digits and '_'" in r.err, r.err
    no_traceback(r)
    assert not marker.exists()


# --- orch's own files ---------------------------------------------------------------------------


def test_a_run_writing_status_json_is_just_a_file(orch):
    path = orch.sweep("""
        name: mine
        command: "D=$ORCH_RUN_DIR;echo '{{\\"state\\": null}}' >$D/status.json; mkdir -p $D/logs; echo x >$D/logs/1.log"
        grid:
          a: [1, 2, 3]
        max_parallel: 1
        store: store
    """)
    r = finish(orch, path)
    assert r.code == 0, r.out + r.err
    assert all(v["state"] == "succeeded" for v in status(orch, "mine").values())
    assert orch("collect", "mine").code == 0


@pytest.mark.parametrize(
    "record", [b"{}", b'{"state": null}', b'{"run_id": "run", "state": "running", "attempt": "x"', b"[1]"]
)
def test_a_corrupt_status_record_is_reported_not_a_crash(orch, record):
    path = orch.sweep("name: corrupt\ncommand: 'true'\nstore: store\n")
    assert finish(orch, path).code == 0
    key = next(orch.store("corrupt").rglob("status.json"))
    key.write_bytes(record)
    for args in (("status", "corrupt"), ("status", "corrupt", "--json"), ("status",), ("collect", "corrupt")):
        r = orch(*args)
        no_traceback(r)
        assert r.code == 0, (args, r.err)
    assert "corrupt" in orch("status", "corrupt").out


# --- the run's life ------------------------------------------------------------------------


def test_a_background_child_does_not_hold_the_run(orch, tmp_path):
    pidfile = tmp_path / "child.pid"
    path = orch.sweep(f"""
        name: bg
        command: "sleep 40 & echo $! > {pidfile}; echo x; exit 0"
        timeout_minutes: 0.5
        store: store
    """)
    t0 = time.time()
    r = finish(orch, path)
    assert r.code == 0 and status(orch, "bg")["run"]["state"] == "succeeded", r.out
    assert time.time() - t0 < 30  # the command ended at once; its orphan did not keep the run going
    child = int(pidfile.read_text())
    retry_until(
        lambda: not os.path.exists(f"/proc/{child}") or open(f"/proc/{child}/stat").read().split()[2] == "Z",
        15,
        0.2,
        "the orphan to be stopped",
    )


def test_cancelling_a_finished_run_changes_nothing(orch):
    path = orch.sweep("name: done1\ncommand: 'true'\nstore: store\n")
    assert finish(orch, path).code == 0
    before = status(orch, "done1")["run"]
    r = orch("cancel", "run")
    no_traceback(r)
    assert "already succeeded" in r.out + r.err
    after = status(orch, "done1")["run"]
    assert after["state"] == "succeeded" and after["elapsed"] == before["elapsed"]


def test_a_notice_that_kills_a_command_without_a_handler_is_a_preemption(orch):
    path = orch.sweep("""
        name: nohandler
        command: "[ $ORCH_ATTEMPT = 1 ] && sleep 60; exit 0"
        max_restarts: 0
        store: store
    """)
    assert orch("launch", str(path), "--detach").code == 0
    retry_until(lambda: status(orch, "nohandler").get("run", {}).get("state") == "running", 30, 0.2, "the run to start")
    r = orch("chaos", "interrupt", "run", "--grace", "20", timeout=120)
    no_traceback(r)
    retry_until(
        lambda: status(orch, "nohandler", gap=ENDED_GAP_S)["run"]["state"] in ("succeeded", "failed"),
        90,
        0.5,
        "the run to end",
    )
    v = status(orch, "nohandler")["run"]
    assert (v["state"], v["attempt"], v["failures"], v["preemptions"]) == ("succeeded", 2, 0, 1), v


# --- signals to the foreground launch -------------------------------------------------------------


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


# --- limits ----------------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_huge_sweeps_are_refused_at_once_with_the_count(orch):
    r = orch(
        "launch", str(orch.sweep("name: huge\ncommand: 'echo {seed}'\nseeds: 1000000000\n")), "--dry-run", timeout=40
    )
    assert r.code == 2 and "1000000000 runs" in r.err and "max_runs" in r.err, r.err
    grid = {"name": "wide", "command": "echo {a} {b}", "grid": {"a": list(range(400)), "b": list(range(300))}}
    r = orch("launch", str(orch.sweep(json.dumps(grid))), "--dry-run", timeout=40)
    assert r.code == 2 and "120000 runs" in r.err, r.err


@pytest.mark.timeout(60)
def test_run_expansion_is_linear_in_the_runs(tmp_path):
    from orchestrator.backends.registry import load_sweep

    p = tmp_path / "s.yaml"
    p.write_text(
        json.dumps(
            {
                "name": "big",
                "command": "echo {a} {b}",
                "grid": {"a": list(range(200)), "b": list(range(150))},
                "max_runs": 30000,
            }
        )
    )
    assert len(load_sweep(p).runs) == 30000  # quadratic id checks took minutes here


# --- errors instead of tracebacks ------------------------------------------------------------------


def test_unusable_paths_are_clear_errors(orch, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    cases = [
        (f"name: st\ncommand: 'true'\nstore: {afile}/store\n", "store"),
        (f"name: wd\ncommand: 'true'\nlocal:\n  workdir: {afile}/work\n", "workdir"),
    ]
    for text, word in cases:
        r = orch("launch", str(orch.sweep(text, name=f"{word}.yaml")))
        no_traceback(r)
        assert r.code == 2 and str(afile) in r.err and word in r.err, r.err
    assert finish(orch, orch.sweep("name: ok1\ncommand: 'true'\nstore: store\n", name="ok.yaml")).code == 0
    r = orch("collect", "ok1", "--out", str(afile))
    no_traceback(r)
    assert r.code == 2 and str(afile) in r.err, r.err
    home = dict(orch.env, ORCH_HOME=str(afile))
    import subprocess

    p = subprocess.run(orch.argv("status"), env=home, capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode == 2 and "ORCH_HOME" in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_deeply_nested_yaml_is_a_clear_error(orch):
    r = orch("launch", str(orch.sweep("name: deep\nparams:\n  a: " + "[" * 5000 + "]" * 5000 + "\n")))
    no_traceback(r)
    assert r.code == 2 and "nested" in r.err, r.err


# --- validation --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, words",
    [
        ("name: x\nmax_parallel: true\n", ["max_parallel", "Fix:"]),
        ("name: x\ntimeout_minutes: .inf\n", ["timeout_minutes", "finite"]),
        ("name: " + "a" * 64 + "\n", ["63 characters"]),
        ("name: 123\n", ["name", "Fix:"]),
        ("name: x\ngrid:\n  lr: 0.1\n", ["grid.lr", "Fix:"]),
        ("name: x\nenv:\n  A: 1\n", ["env.A", "Fix:"]),
        ("name: x\nseeds: two\n", ["seeds", "a count"]),
    ],
)
def test_wrong_field_values_are_clear_errors_naming_the_field(orch, text, words):
    r = orch("launch", str(orch.sweep(text)))
    no_traceback(r)
    assert r.code == 2, r.err
    for w in words:
        assert w in r.err, (w, r.err)


def test_chaos_grace_must_be_positive(orch):
    r = orch("chaos", "interrupt", "x", "--grace", "-5")
    assert r.code == 2 and "grace" in r.err.lower(), r.err
    no_traceback(r)


# --- small surprises --------------------------------------------------------------------------------------


def test_long_values_keep_distinct_ids_and_yaml_exponents_are_numbers(tmp_path):
    from orchestrator.backends.registry import load_sweep

    p = tmp_path / "s.yaml"
    a, b = "x" * 45 + "1", "x" * 45 + "2"
    p.write_text(f"name: ids\ncommand: echo {{v}} {{lr}}\ngrid:\n  v: [{a}, {b}]\n  lr: [1e-3, 3e-4]\n")
    runs = load_sweep(p).runs
    assert len({r.run_id for r in runs}) == 4
    assert {r.params["lr"] for r in runs} == {0.001, 0.0003}


def test_dry_run_refuses_a_changed_sweep_like_launch(orch):
    path = orch.sweep("name: chg\ncommand: 'true'\nstore: store\n")
    assert finish(orch, path).code == 0
    path.write_text("name: chg\ncommand: 'echo changed'\nstore: store\n")
    dry, real = orch("launch", str(path), "--dry-run"), orch("launch", str(path))
    assert dry.code == real.code != 0 and "different sweep" in dry.err and "different sweep" in real.err, (
        dry.err,
        real.err,
    )


def test_same_name_other_store_is_refused(orch):
    assert finish(orch, orch.sweep("name: twin\ncommand: 'true'\nstore: store\n", name="a.yaml")).code == 0
    r = orch("launch", str(orch.sweep("name: twin\ncommand: 'true'\nstore: other\n", name="b.yaml")))
    no_traceback(r)
    assert r.code != 0 and "twin" in r.err and "store" in r.err, r.err


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


def test_short_timeouts_act_quickly_and_read_right(orch):
    path = orch.sweep("name: quick\ncommand: 'sleep 60'\ntimeout_minutes: 0.05\nmax_restarts: 0\nstore: store\n")
    t0 = time.time()
    finish(orch, path)
    v = status(orch, "quick")["run"]
    assert v["state"] == "failed" and "3 s" in v["reason"], v
    assert time.time() - t0 < 25


def test_cli_misuse_is_a_clear_error_without_a_traceback(orch):
    r = orch("down")
    assert r.code == 2 and "(not both)" not in r.err and "--all" in r.err, r.err
    assert finish(orch, orch.sweep("name: small\ncommand: 'true'\nstore: store\n")).code == 0
    r = orch("logs", "run", "--attempt", "0")
    assert r.code == 2 and "attempt" in r.err, r.err
    assert (
        orch(
            "launch", str(orch.sweep("name: live\ncommand: 'sleep 30'\nstore: store\n", name="l.yaml")), "--detach"
        ).code
        == 0
    )
    retry_until(lambda: status(orch, "live").get("run", {}).get("state") == "running", 30, 0.2, "the run")
    r = orch("attach", "live/run")  # no terminal here
    no_traceback(r)
    assert r.code == 2 and "terminal" in r.err, r.err
    orch("down", "live")


def test_a_store_that_becomes_unwritable_mid_run_is_a_clear_error_and_nothing_is_lost(orch, job):
    path = orch.sweep(f"""
        name: rostore
        command: "{job(steps=2, release=True)}"
        store: store
    """)
    p = orch.popen("launch", str(path))
    retry_until(lambda: status(orch, "rostore").get("run", {}).get("state") == "running", 30, 0.2, "the run")
    folder = orch.store("rostore")
    folder.rename(folder.with_name("rostore.saved"))
    folder.write_text("not a folder any more")  # every write under it now fails
    out = p.communicate(timeout=60)[0]
    assert (
        p.returncode == 2 and "cannot be read or written" in out and str(orch.store()) in out and "Traceback" not in out
    ), out
    folder.unlink()
    folder.with_name("rostore.saved").rename(folder)
    job.release.touch()  # the run was never stopped; its agent kept going and records its end once it can
    r = finish(orch, path)
    assert r.code == 0, r.out + r.err
    v = status(orch, "rostore")["run"]
    assert v["state"] == "succeeded" and v["attempt"] == 1, v


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


def test_a_run_whose_results_cannot_reach_the_store_is_not_succeeded_until_they_do(orch, job):
    path = orch.sweep(f"""
        name: finsync
        command: "{job(steps=2, release=True)}"
        store: store
    """)
    assert orch("launch", str(path), "--detach").code == 0
    stored = orch.store("finsync", "run", "metrics.jsonl")
    retry_until(stored.exists, 30, 0.2, "a first sync of the run folder")
    folder = stored.parent
    folder.rename(folder.with_name("run.saved"))
    folder.write_text("not a folder any more")  # the run folder's writes fail; its records (.orch/) still land
    agent_log = orch.home / "work" / "finsync" / "run" / "ctl" / "agent.log"
    job.release.touch()
    retry_until(
        lambda: (
            "results are not in the store yet" in agent_log.read_text()
            or status(orch, "finsync")["run"]["state"] != "running"
        ),
        60,
        0.2,
        "the command to end and its final sync to fail",
    )
    v = status(orch, "finsync")["run"]
    assert v["state"] == "running" and "writing its results to the store" in v["reason"], v
    folder.unlink()
    folder.with_name("run.saved").rename(folder)
    retry_until(
        lambda: status(orch, "finsync", gap=ENDED_GAP_S)["run"]["state"] == "succeeded", 60, 0.2, "the run to succeed"
    )
    work = orch.home / "work" / "finsync" / "run" / "run" / "metrics.jsonl"
    assert stored.read_text() == work.read_text()
    assert len(stored.read_text().splitlines()) > 2  # the lines written after the store refused them are there
