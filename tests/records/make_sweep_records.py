"""Record a sweep with an older orch as a user who upgrades mid-sweep leaves it
(tests/unit/store/test_records.py relaunches it).

    python tests/records/make_sweep_records.py COMMIT [COMMIT ...]    (`.`: this checkout, as it is)

For each commit: its tree (git archive) runs `orch launch` on a two-run local sweep. Run x=1 ends at once; run x=2
waits for a file that only the test creates. Once x=1 has succeeded and x=2 is running, the controller and its tmux
server are killed (SIGKILL: a laptop that died, or a user who stopped orch to upgrade it), and the store is copied to
tests/records/sweeps/<date>-<commit>/ with the generation folder written as @ROOT@. Nothing here is run by the suite.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
# x=1 ends at once; x=2 waits for $ORCH_HOME/release (the test creates it). Each start is counted in $ORCH_HOME/ran.
SWEEP = """\
name: upgraded
command: 'echo {x} >> "$ORCH_HOME/ran"; test {x} = 1 || until test -e "$ORCH_HOME/release"; do sleep 0.2; done'
grid:
  x: [1, 2]
max_parallel: 2
max_restarts: 0
store: store
"""


def schema(tree: Path) -> str:
    for line in (tree / "orchestrator" / "sweep" / "record.py").read_text().splitlines():
        if line.startswith("SWEEP_SCHEMA = "):
            return line.split("=")[1].strip()
    return "?"


def state_of(store: Path, run: str) -> str:
    for path in (store / "upgraded" / ".orch" / run / "status.json", store / "upgraded" / run / "status.json"):
        try:
            return json.loads(path.read_text()).get("state", "")
        except (OSError, ValueError):
            continue
    return ""


def record(commit: str) -> Path:
    rev = "HEAD" if commit == "." else commit
    full = subprocess.check_output(["git", "-C", str(REPO), "rev-parse", rev], text=True).strip()
    date = subprocess.check_output(
        ["git", "-C", str(REPO), "show", "-s", "--format=%cd", "--date=format:%Y-%m-%d", full], text=True
    ).strip()
    root = Path(tempfile.mkdtemp(prefix="orch-rec-"))
    tree = root / "tree"
    if commit == ".":
        tree = REPO
        date = time.strftime("%Y-%m-%d", time.gmtime())
    else:
        tree.mkdir()
        archive = subprocess.run(["git", "-C", str(REPO), "archive", full], check=True, capture_output=True).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(tree, filter="data")
    (root / "sweep.yaml").write_text(SWEEP)
    socket = f"orch-rec-{full[:8]}"
    env = dict(os.environ, ORCH_HOME=str(root / "home"), ORCH_TMUX_SOCKET=socket, PYTHONPATH=str(tree))
    env.pop("TMUX", None)
    log = open(root / "launch.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", "launch", str(root / "sweep.yaml")],
        cwd=root,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    store = root / "store"
    deadline = time.monotonic() + 120
    while not (state_of(store, "x=1") == "succeeded" and state_of(store, "x=2") == "running"):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"{commit}: the sweep did not reach x=1 succeeded, x=2 running; see {root}/launch.log")
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    subprocess.run(["tmux", "-L", socket, "kill-server"], check=False)
    out = HERE / "sweeps" / (f"{date}-{full[:7]}" if commit != "." else f"{date}-schema-{schema(tree)}")
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(store, out / "store")
    shutil.copy(root / "sweep.yaml", out / "sweep.yaml")
    for path in out.rglob("*"):
        if path.is_file():
            try:
                text = path.read_text()
            except UnicodeDecodeError:
                continue
            path.write_text(text.replace(str(root), "@ROOT@"))
    subject = subprocess.check_output(["git", "-C", str(REPO), "show", "-s", "--format=%s", full], text=True)
    if commit == ".":
        subject = f"this checkout on {full[:7]} (uncommitted changes included), sweep record schema {schema(tree)}"
    (out / "ORCH_VERSION").write_text(f"{full} {date}\n{subject.strip()[:200]}\n")
    shutil.rmtree(root)
    return out


if __name__ == "__main__":
    for c in sys.argv[1:]:
        print(record(c))
