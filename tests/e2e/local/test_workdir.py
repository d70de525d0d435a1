"""`workdir:` and `setup:` through `orch launch` on the local backend: a user's own project (a script, a helper module
beside it, a config read by a relative path, a setup step the script depends on) runs as it would by hand; the code
reaches the host once and `setup:` runs once however many runs share it; which code each run ran is in runs.csv;
and what must be refused is refused before anything starts."""

from __future__ import annotations

import csv
import json
import os
import textwrap
from pathlib import Path

import pytest

from orchestrator.wait import retry_until
from tests.conftest import no_traceback, run_states

pytestmark = pytest.mark.slow

TRAIN = textwrap.dedent("""
    import json, os, sys, time
    hold = os.environ.get("HOLD")                  # a test holds the run here until it says go
    if hold:
        open(hold + ".started", "w").close()
        while not os.path.exists(hold):
            time.sleep(0.05)
    sys.path.insert(0, os.environ["DEPS"])
    import dep                                     # what `setup:` installed
    from helper import double                      # a module beside the script
    cfg = json.load(open("conf/config.json"))      # a file read by a relative path
    lr = float(sys.argv[sys.argv.index("--lr") + 1])
    with open(os.path.join(os.environ["ORCH_RUN_DIR"], "metrics.jsonl"), "a") as f:
        f.write(json.dumps({"epoch": 1, "test_acc": double(lr) + cfg["bias"] + dep.VALUE}) + "\\n")
    print("ran in", os.getcwd(), flush=True)
""")
# what a `pip install -r requirements.txt` does, in miniature: it installs a module, and counts itself on the host
SETUP = 'mkdir -p "$DEPS" && echo "VALUE = 40" > "$DEPS/dep.py" && echo once >> "$DEPS/setups" && echo set up'


def project(root: Path, setup: str = SETUP, extra: str = "") -> Path:
    """The project of a user who is not us: a folder with its script, helper, config and a sweep file."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "train.py").write_text(TRAIN)
    (root / "helper.py").write_text("def double(x):\n    return 2 * x\n")
    (root / "conf").mkdir(exist_ok=True)
    (root / "conf" / "config.json").write_text('{"bias": 0.5}')
    sweep = root / "sweep.yaml"
    sweep.write_text(
        textwrap.dedent(f"""
        name: mine
        command: "python3 train.py --lr {{lr}}"
        grid:
          lr: [0.1, 0.2, 0.3]
        max_parallel: 3
        max_restarts: 0
        env:
          DEPS: {root.parent / "deps"}
        setup: '{setup}'
        store: store
        """)
        + textwrap.dedent(extra)
    )
    return sweep


def logs(orch, sweep: str, run: str) -> str:
    r = orch("logs", f"{sweep}/{run}")
    assert r.code == 0, r.err
    return r.out


@pytest.mark.timeout(240)
def test_a_users_own_project_runs_with_its_setup_once_and_records_its_code(orch, tmp_path):
    path = project(tmp_path / "proj")
    dry = orch("launch", str(path), "--dry-run")
    assert dry.code == 0, dry.out + dry.err
    assert f"code: {tmp_path / 'proj'}: 3 files" in dry.out, dry.out  # train.py, helper.py, conf/config.json
    r = orch("launch", str(path), timeout=200)
    no_traceback(r)
    assert r.code == 0, r.out + r.err
    states = run_states(orch, "mine")
    assert {s["state"] for s in states.values()} == {"succeeded"}, states

    # three runs started together on one host: the code was unpacked once and `setup:` ran once (counted on the host)
    assert (tmp_path / "deps" / "setups").read_text() == "once\n"
    texts = [logs(orch, "mine", run) for run in states]
    assert sum("fetched and unpacked" in t for t in texts) == 1, texts
    assert sum("[orch] setup (once per host" in t for t in texts) == 1, texts
    code_dirs = [p for p in (orch.home / "work" / ".code").glob("*.ok") if ".setup-" not in p.name]
    assert len(code_dirs) == 1
    code_dir = code_dirs[0].with_suffix("")
    assert all(f"ran in {code_dir}" in t for t in texts), texts
    assert not os.access(code_dir / "train.py", os.W_OK) or os.geteuid() == 0  # read-only (root may write anyway)
    assert not (code_dir / "train.py").stat().st_mode & 0o222

    # the code each run ran: runs.csv's `code` is the snapshot sweep.json records, and the folder the runs ran in
    record = json.loads((tmp_path / "proj" / "store" / "mine" / "sweep.json").read_text())
    digest = record["code"]["digest"]
    assert code_dir.name == digest and record["code"]["files"] == 3
    c = orch("collect", "mine", "--out", str(tmp_path / "res"))
    assert c.code == 0, c.err
    with open(tmp_path / "res" / "runs.csv") as f:
        rows = list(csv.DictReader(f))
    assert {row["code"] for row in rows} == {digest}
    assert sorted(float(row["test_acc"]) for row in rows) == pytest.approx([40.7, 40.9, 41.1])

    # a second sweep of the same code on this host: nothing fetched, nothing set up again
    path.write_text(path.read_text().replace("name: mine", "name: again"))
    r2 = orch("launch", str(path), timeout=200)
    assert r2.code == 0, r2.out + r2.err
    assert (tmp_path / "deps" / "setups").read_text() == "once\n"
    assert "on this host already" in logs(orch, "again", "lr=0.1")


@pytest.mark.timeout(240)
def test_a_failing_setup_fails_the_attempt_with_its_log_tail_and_runs_again_on_the_next(orch, tmp_path):
    path = project(tmp_path / "proj", setup="echo no such package: torchh >&2; exit 3", extra="max_restarts: 1\n")
    text = path.read_text().replace("lr: [0.1, 0.2, 0.3]", "lr: [0.1]")
    path.write_text(text.replace("max_restarts: 0\n", ""))
    r = orch("launch", str(path), timeout=200)
    assert r.code == 1, r.out + r.err  # a failed run fails the launch
    run = run_states(orch, "mine")["lr=0.1"]
    assert run["state"] == "failed" and run["attempt"] == 2, run  # counted against max_restarts like the command
    assert "setup failed (exit code 3)" in run["reason"], run
    assert "no such package: torchh" in run["log_tail"], run
    out = logs(orch, "mine", "lr=0.1")
    assert "no such package: torchh" in out and "train.py" not in out.split("setup failed")[-1]  # never ran
    assert not list((orch.home / "work" / ".code").glob("*.setup-*.ok"))  # no marker: the next attempt tries again


def test_a_project_over_the_cap_is_refused_before_anything_starts_naming_the_largest_files(orch, tmp_path):
    path = project(tmp_path / "proj", extra="workdir_max_mb: 1\n")
    (tmp_path / "proj" / "weights.bin").write_bytes(os.urandom(1_500_000))
    (tmp_path / "proj" / "data").mkdir()
    (tmp_path / "proj" / "data" / "train.npy").write_bytes(b"\0" * 600_000)
    for args in (("--dry-run",), ()):
        r = orch("launch", str(path), *args)
        no_traceback(r)
        assert r.code == 2, r.out + r.err
        assert f"{path}:" in r.err and "workdir" in r.err, r.err
        assert "weights.bin (1.5 MB)" in r.err and "data/train.npy (0.6 MB)" in r.err and ".orchignore" in r.err
    assert not (tmp_path / "proj" / "store").exists()  # nothing recorded, nothing started
    assert orch.tmux("list-sessions").returncode != 0
    (tmp_path / "proj" / ".orchignore").write_text("*.bin\ndata/\n")
    ok = orch("launch", str(path), "--dry-run")
    assert ok.code == 0 and "code: " in ok.out and "4 files" in ok.out, ok.out + ok.err  # .orchignore itself goes


def test_what_a_workdir_may_not_hold_is_refused_or_left_out_and_said(orch, tmp_path):
    root = tmp_path / "proj"
    path = project(root)
    (root / ".env").write_text("API_KEY=hunter2\n")
    (root / "keys").mkdir()
    (root / "keys" / "deploy.pem").write_text("-----BEGIN PRIVATE KEY-----\n")
    (root / "inside").symlink_to("helper.py")  # a link inside the folder stays a link
    dry = orch("launch", str(path), "--dry-run")
    assert dry.code == 0, dry.err
    assert "left out, as they look like secrets: .env, keys/deploy.pem" in dry.out, dry.out
    assert "4 files" in dry.out, dry.out

    (root / "outside").symlink_to(tmp_path)  # a link out of the folder: orch never follows one
    r = orch("launch", str(path), "--dry-run")
    no_traceback(r)
    assert r.code == 2 and "outside is a link to" in r.err and "outside the folder" in r.err, r.err
    (root / "outside").unlink()

    odd = os.fsencode(root) + b"/caf\xe9.txt"  # a Latin-1 name: not UTF-8
    with open(odd, "wb") as f:
        f.write(b"x")
    r = orch("launch", str(path), "--dry-run")
    no_traceback(r)
    assert r.code == 2 and "not UTF-8" in r.err and "rename" in r.err, r.err
    os.unlink(odd)

    path.write_text(path.read_text() + "workdir: src\n")  # a folder that is not there: file:line
    r = orch("launch", str(path), "--dry-run")
    no_traceback(r)
    line = path.read_text().splitlines().index("workdir: src") + 1
    assert r.code == 2 and f"{path}:{line}: workdir:" in r.err and "does not exist" in r.err, r.err


@pytest.mark.timeout(240)
def test_a_relaunch_after_an_edit_keeps_the_launched_code_and_names_what_changed(orch, tmp_path):
    root = tmp_path / "proj"
    hold = tmp_path / "go"
    path = project(root)
    text = path.read_text().replace("lr: [0.1, 0.2, 0.3]", "lr: [0.1]")
    path.write_text(text.replace("  DEPS:", f"  HOLD: {hold}\n  DEPS:"))
    assert orch("launch", str(path), "--detach").code == 0
    retry_until(lambda: Path(f"{hold}.started").exists(), 60, 0.1, "the run to start")
    # `orch attach` opens the run's window: its terminal is in the workdir's snapshot, as the command is
    where = orch.tmux("display-message", "-p", "-t", "=orch_mine_lr=0_1:run", "#{pane_current_path}")
    assert where.returncode == 0 and "/.code/" in where.stdout, where.stdout + where.stderr
    assert orch("down", "mine").code == 0  # stopped half-way: the next launch continues it
    (root / "helper.py").write_text("def double(x):\n    raise SystemExit(9)\n")  # an edit that would break it
    (root / "notes.txt").write_text("new")
    dry = orch("launch", str(path), "--dry-run")
    assert dry.code == 0, dry.err
    assert "this folder changed since the sweep was launched (helper.py, notes.txt)" in dry.out, dry.out
    hold.touch()
    r = orch("launch", str(path), timeout=200)
    assert r.code == 0, r.out + r.err  # it ran the code it was launched with, not the edit
    assert "this folder changed since the sweep was launched" in r.out
    run = run_states(orch, "mine")["lr=0.1"]
    assert run["state"] == "succeeded" and run["attempt"] == 2, run
