"""The tests' fork server (tests/zygote.py) runs `orch` as a new interpreter would: the same exit status, stdout and
stderr, in the call's own environment and folder, and a process of its own each time."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.zygote import Zygote


@pytest.fixture
def zygote(orch):
    z = Zygote(orch.env)
    yield z
    z.close()


def fresh(orch, *args: str, cwd=None):
    p = subprocess.run(
        [sys.executable, "-X", "faulthandler", "-m", "orchestrator.cli", *args],
        env=orch.env,
        cwd=cwd or orch.tmp,
        capture_output=True,
        text=True,
    )
    return p.returncode, p.stdout, p.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["status", "--json"],
        ["status", "nosuchsweep"],  # exit 2, an error on stderr
        ["launch", "missing.yaml", "--dry-run"],
        ["launch", "bad.yaml", "--dry-run"],  # a file that is not a sweep: its errors name the file and field
        ["nosuchcommand"],  # click's usage error
    ],
)
def test_a_call_through_the_fork_server_is_the_call_of_a_new_interpreter(orch, zygote, args):
    (orch.tmp / "bad.yaml").write_text("name: x\ncommand: 3\nmax_parallel: -1\n")
    got = zygote.run(args, orch.env, orch.tmp, 60)
    assert got[3] is False
    assert got[:3] == fresh(orch, *args)


def test_each_call_has_its_own_environment_folder_and_process(orch, zygote, tmp_path):
    names = ("sweepalpha", "sweepbravo")
    for name in names:  # a sweep file named by a relative path is read from the call's folder
        (tmp_path / name).mkdir()
        (tmp_path / name / "s.yaml").write_text(f"name: {name}\ncommand: 'true'\nstore: store\n")
    outs = [zygote.run(["launch", "s.yaml", "--dry-run"], orch.env, tmp_path / n, 60) for n in names]
    assert outs[0][0] == 0 and "sweepalpha" in outs[0][1] and "sweepbravo" not in outs[0][1], outs[0]
    assert outs[1][0] == 0 and "sweepbravo" in outs[1][1] and "sweepalpha" not in outs[1][1], outs[1]
    other = dict(orch.env, ORCH_HOME=str(tmp_path / "elsewhere"))  # a sweep launched here is not listed there
    assert orch("launch", str(orch.sweep("name: here\ncommand: 'true'\nstore: store\n"))).code == 0
    assert [r["sweep"] for r in json.loads(zygote.run(["status", "--json"], orch.env, orch.tmp, 60)[1])] == ["here"]
    assert json.loads(zygote.run(["status", "--json"], other, orch.tmp, 60)[1]) == []


def test_a_call_past_its_time_prints_every_threads_stack_and_is_ended(orch, zygote):
    path = orch.sweep("name: slow\ncommand: 'sleep 60'\nstore: store\n")
    try:
        code, _out, err, stuck = zygote.run(["launch", str(path)], orch.env, orch.tmp, 3)
        assert stuck and code == -6, (code, err[-2000:])  # SIGABRT: faulthandler's dump, then the default action
        assert "Fatal Python error: Aborted" in err and "most recent call first" in err, err[-2000:]
    finally:
        assert orch("down", "slow").code == 0


def test_a_trainer_run_through_its_fork_server_ends_bit_for_bit_as_a_new_interpreters(tmp_path):
    """The trainer's fork server (torch imported before the fork) changes nothing a run computes: the same weights,
    bit for bit, the same metrics but for their clocks, the same exit status."""
    from tests.unit.trainer.test_train import SMALL, assert_same_weights, final_weights, trainer_env

    args = [*SMALL, "--epochs", "1", "--synthetic-train", "256"]
    env = trainer_env()
    z = Zygote(env, "trainer")
    try:
        code, _, err, stuck = z.run([*args, "--out", str(tmp_path / "forked")], env, tmp_path, 240)
    finally:
        z.close()
    fresh = subprocess.run(
        [sys.executable, "-m", "trainer", *args, "--out", str(tmp_path / "fresh")],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert (code, stuck) == (0, False) and fresh.returncode == 0, err[-3000:] + fresh.stderr[-3000:]
    assert_same_weights(final_weights(tmp_path / "forked"), final_weights(tmp_path / "fresh"))

    def lines(out):
        rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in r.items() if not (k.endswith("_s") or "time" in k)} for r in rows]  # but clocks

    assert lines(tmp_path / "forked") == lines(tmp_path / "fresh")
