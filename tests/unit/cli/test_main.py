"""The `orch` group (cli/main.py): its commands load lazily, its help lists them, RUN arguments resolve (a sweep named
or given as a file), and misuse (a path that cannot be used, a bad option) is a clear error without a traceback."""

from __future__ import annotations

import importlib
import os

import click
import pytest

from orchestrator.cli.main import COMMANDS, main
from orchestrator.control.state import State
from orchestrator.wait import retry_until
from tests.conftest import finish, no_traceback
from tests.conftest import run_states as status


def test_each_command_loads_from_its_module_and_the_help_line_shown_for_it_is_its_own():
    for name, (where, line) in COMMANDS.items():
        module, attr = where.split(":")
        cmd = getattr(importlib.import_module(module), attr)
        assert isinstance(cmd, click.Command) and cmd.name == name, where
        if cmd.hidden:
            assert line is None, name
        else:
            assert line is not None, name
            assert click.Command(name, help=line).get_short_help_str(1000) == cmd.get_short_help_str(1000), name
    ctx = click.Context(main)
    assert main.list_commands(ctx) == sorted(COMMANDS)
    assert main.get_command(ctx, "launch").name == "launch" and main.get_command(ctx, "nope") is None


def test_orch_help_lists_every_visible_command(orch):
    r = orch("--help")
    assert r.code == 0, r.err
    section = r.out.split("Commands:\n", 1)[1].split("\n\n", 1)[0]
    listed = {line.split()[0] for line in section.splitlines()}
    assert listed == {name for name, (_, line) in COMMANDS.items() if line is not None}, r.out
    assert "Launch (or continue) the sweep" in r.out and "_controller" not in r.out


def test_bare_run_ids_reach_a_local_sweep_when_a_sweep_of_an_s3_store_is_out_of_reach_logs_attach_cancel(orch, job):
    path = orch.sweep(f"""
        name: b-local
        command: "{job(steps=2, release=True)}"
        grid:
          lr: [0.2]
        seeds: 2
        max_parallel: 2
        store: store
    """)
    assert orch("launch", str(path), "--detach").code == 0
    retry_until(
        lambda: all(r["state"] == "running" for r in status(orch, "b-local").values()), 60, 0.3, "the runs to start"
    )
    # a sweep launched on AWS from here earlier, and a shell without AWS credentials
    State(orch.home).remember("a-aws", str(orch.tmp / "gone.yaml"), "s3://some-bucket/sweeps", "aws")
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        orch.env.pop(key, None)
    orch.env.update(
        AWS_CONFIG_FILE=os.devnull,
        AWS_SHARED_CREDENTIALS_FILE=os.devnull,
        AWS_EC2_METADATA_DISABLED="true",
        AWS_ENDPOINT_URL="http://127.0.0.1:9",
    )
    logs = orch("logs", "lr=0.2,seed=1")
    assert "credentials" not in logs.err and (logs.code == 0 or "no log for attempt 1 of lr=0.2,seed=1" in logs.err), (
        logs.out + logs.err
    )  # the run was found (its log may not have reached the store yet)
    with orch.in_a_terminal("attach", "lr=0.2,seed=1") as (screen, _):
        retry_until(lambda: "of lr=0.2,seed=1" in screen(), 30, 0.2, "the run's own terminal, attached by its bare id")
        assert "credentials" not in screen(), screen()
    cancel = orch("cancel", "lr=0.2,seed=1")
    assert cancel.code == 0 and "Traceback" not in cancel.err, cancel.out + cancel.err
    retry_until(lambda: status(orch, "b-local")["lr=0.2,seed=1"]["state"] == "cancelled", 60, 0.5, "the cancel")
    missing = orch("logs", "lr=9,seed=9")
    assert missing.code != 0 and "no run 'lr=9,seed=9'" in missing.err, missing.err
    assert "a-aws: No AWS credentials found" in missing.err, missing.err  # which sweep was not searched, and why
    job.release.touch()
    orch("down", "b-local")


@pytest.mark.slow
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


@pytest.mark.slow
def test_chaos_grace_must_be_positive(orch):
    r = orch("chaos", "interrupt", "x", "--grace", "-5")
    assert r.code == 2 and "grace" in r.err.lower(), r.err
    no_traceback(r)


@pytest.mark.slow
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


@pytest.mark.slow
def test_every_command_by_name_addresses_the_runs_of_the_file(orch, job):
    # grid keys not in alphabetical order: records are written with sorted keys
    path = orch.sweep(f"""
        name: named
        command: "{job(steps=2, release=True)}"
        grid:
          lr: [0.1, 0.2]
          batch_size: [64]
        max_parallel: 2
        store: store
    """)
    assert orch("launch", str(path), "--detach").code == 0
    ids = {"lr=0.1,batch_size=64", "lr=0.2,batch_size=64"}
    retry_until(
        lambda: {k for k, v in status(orch, str(path)).items() if v["state"] == "running"} == ids,
        60,
        0.3,
        "both runs to run",
    )
    by_name = status(orch, "named")
    assert set(by_name) == ids and all(v["state"] == "running" for v in by_name.values()), by_name
    log = orch.store("named", ".orch", "lr=0.1,batch_size=64", "logs", "1.log")
    retry_until(lambda: log.exists() and "tick" in log.read_text(), 60, 0.3, "the log to reach the store")
    logs = orch("logs", "lr=0.1,batch_size=64")
    assert logs.code == 0 and "tick" in logs.out, logs.out + logs.err
    down = orch("down", "named")
    assert down.code == 0 and "nothing of sweep" not in down.out, down.out + down.err
    final = status(orch, str(path))
    assert {v["state"] for v in final.values()} == {"stopped"}, final
    assert orch.tmux("list-sessions").stdout.count("orch_named_") == 0


def test_python_m_orchestrator_cli_exits_with_its_own_status_after_a_caught_interrupt(orch, tmp_path):
    """A KeyboardInterrupt raised inside an exec of source text (a dataclass being made during a lazy import, as a
    signal lands) and caught further up: `python -m orchestrator.cli` (how the background controller, the remote
    controller's units and the notifier start) still exits with the command's status, not killed by SIGINT (CPython
    3.11 keeps the inner exec's flag; `orch launch` was seen handing off, printing "detached", then ending with -2)."""
    import subprocess
    import sys
    from pathlib import Path

    here = Path(__file__).parent / "kiexec"
    env = {**orch.env, "PYTHONPATH": os.pathsep.join([str(here), *filter(None, [orch.env.get("PYTHONPATH")])])}
    probe = [sys.executable, "-c", "import builtins; print(builtins.exec.__name__)"]
    seen = subprocess.run(probe, env=env, capture_output=True, text=True)
    assert seen.stdout.strip() == "_exec_then_a_caught_interrupt", seen.stdout + seen.stderr  # the fault is in place
    for args, code in ((["--version"], 0), (["status", "no-such-sweep"], 2)):
        p = subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], env=env, capture_output=True, text=True)
        assert p.returncode == code, (args, p.returncode, p.stdout + p.stderr)
        assert "Traceback" not in p.stderr, p.stderr
