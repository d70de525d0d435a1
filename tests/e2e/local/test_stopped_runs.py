"""A run orch stops keeps what it wrote (README): pruned, cancelled or stopped by `orch down`, its folder and its log
reach the store, so `orch logs`, `orch collect` and TensorBoard show it. The command below writes its last metrics
line and its last log line in its SIGTERM handler, after orch asked it to stop: only the agent's sync after the stop
can carry them to the store (the periodic sync, every 2 s locally, is over by then)."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

from orchestrator.wait import retry_until
from tests.conftest import run_states

pytestmark = pytest.mark.slow

GOODBYE = 7  # the value of the metrics line the command writes on its SIGTERM

SCRIPT = textwrap.dedent("""
    import json, os, signal, sys, time
    x, ready = int(sys.argv[1]), sys.argv[2]
    run, out = os.environ["ORCH_RUN_ID"], os.environ["ORCH_RUN_DIR"]
    def line(**values):
        with open(os.path.join(out, "metrics.jsonl"), "a") as f:
            f.write(json.dumps(values) + "\\n")
    def bye(*_):
        line(epoch=1, acc=x / 10, goodbye=GOODBYE)
        print(f"last words of {run}", flush=True)
        sys.exit(143)
    signal.signal(signal.SIGTERM, bye)
    line(epoch=1, acc=x / 10)
    print(f"epoch 1 of {run}", flush=True)
    open(ready + "." + run, "w").close()
    if x < 5:
        time.sleep(600)  # a losing run: it waits to be stopped
""").replace("GOODBYE", str(GOODBYE))


def _kept(orch, tmp_path, sweep: str, run: str) -> None:
    """The run's log and its last metrics line, the ones written after the stop, are in the store."""
    logs = orch("logs", f"{sweep}/{run}")
    assert logs.code == 0 and f"last words of {run}" in logs.out, logs.out + logs.err
    out = tmp_path / f"res-{sweep}"
    c = orch("collect", sweep, "--out", str(out))
    assert c.code == 0, c.err
    rows = {r["run_id"]: r for r in json.loads((out / "runs.json").read_text())["runs"]}
    assert rows[run]["goodbye"] == GOODBYE, rows[run]


@pytest.mark.timeout(300)
def test_a_pruned_run_keeps_its_folder_and_log(orch, tmp_path):
    script = tmp_path / "curve.py"
    script.write_text(SCRIPT)
    # x=9 reports first and is kept (no decision below min_runs); x=1 then falls under the cutoff and is pruned
    path = orch.sweep(f"""
        name: pruny
        command: "{sys.executable} {script} {{x}} {tmp_path / "ready"}"
        grid:
          x: [9, 1]
        max_parallel: 1
        store: store
        prune:
          metric: acc
          rungs: [1]
          keep: 0.5
          min_runs: 2
    """)
    r = orch("launch", str(path), timeout=240)
    assert r.code == 0, r.out + r.err
    states = run_states(orch, "pruny")
    assert states["x=1"]["state"] == "pruned" and states["x=9"]["state"] == "succeeded", states
    _kept(orch, tmp_path, "pruny", "x=1")


@pytest.mark.timeout(300)
def test_a_cancelled_run_keeps_its_folder_and_log(orch, tmp_path):
    script = tmp_path / "curve.py"
    script.write_text(SCRIPT)
    path = orch.sweep(f"""
        name: cancelly
        command: "{sys.executable} {script} 1 {tmp_path / "ready"}"
        store: store
    """)
    assert orch("launch", str(path), "--detach").code == 0
    retry_until(lambda: (tmp_path / "ready.run").exists(), 120, 0.2, "the command to start")
    c = orch("cancel", "cancelly/run")
    assert c.code == 0 and "cancelled cancelly/run" in c.out, c.out + c.err
    assert run_states(orch, "cancelly")["run"]["state"] == "cancelled"
    _kept(orch, tmp_path, "cancelly", "run")
