"""`target:` (time and dollars to a target) and `prune:` (asynchronous successive halving)."""

from __future__ import annotations

import csv
import json
import sys
import textwrap

import pytest

from orchestrator.backends.registry import load_sweep
from orchestrator.control.prune import Rungs
from orchestrator.store.folder import LocalStore

# Each run's test_acc at its rungs (epoch 2 and epoch 4). Arrival is the grid's order (max_parallel 1,
# and each run waits at a rung until the controller has recorded it there). Worked by hand, with
# keep 0.34 and min_runs 3 (the cutoff is the k-th best of the n runs at the rung, k = max(1, floor(n * keep))):
#   rung 2: x=0 (n=1) and x=1 (n=2) go on undecided; x=2 .15 < .45 (k=1): pruned; x=3 .40, x=4 .10: pruned;
# x=5 .475 (n=6, k=2, cutoff .45): kept; x=6 .20, x=7 .30 (k=2): pruned; x=8 .35 (n=9, k=3, cutoff .40): pruned
#   rung 4: x=0 .50, x=1 .90 undecided (n=1, 2); x=5 .85 (n=3, k=1, cutoff .90): pruned
CURVES = {
    0: (0.25, 0.50),
    1: (0.45, 0.90),
    2: (0.15, 0.60),
    3: (0.40, 0.70),
    4: (0.10, 0.20),
    5: (0.475, 0.85),
    6: (0.20, 0.30),
    7: (0.30, 0.40),
    8: (0.35, 0.99),
}
PRUNED_AT = {2: 2, 3: 2, 4: 2, 6: 2, 7: 2, 8: 2, 5: 4}

CURVE_SCRIPT = textwrap.dedent("""
    import json, os, sys, time
    x, rungs_file = int(sys.argv[1]), sys.argv[2]
    r2, r4 = CURVES[x]
    run = os.environ["ORCH_RUN_ID"]
    for epoch, acc in ((1, r2 / 2), (2, r2), (3, (r2 + r4) / 2), (4, r4)):
        with open(os.path.join(os.environ["ORCH_RUN_DIR"], "metrics.jsonl"), "a") as f:
            line = {"epoch": epoch, "test_acc": acc, "elapsed_s": 10.0 * epoch, "time": time.time()}
            f.write(json.dumps(line) + "\\n")
        if epoch in (2, 4):  # wait for the controller to record this run at the rung: arrival stays in grid order
            for _ in range(6000):
                try:
                    table = json.load(open(rungs_file))
                    if run in table["values"][str(epoch)] and run not in table["pruned"]:
                        break  # kept: go on (a pruned run waits here to be stopped)
                except (OSError, ValueError, KeyError):
                    pass
                time.sleep(0.1)
""")


def test_rungs_decide_by_arrival_and_never_twice(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(
        "name: r\ncommand: 'true'\nstore: st\ngrid:\n  x: [0, 1, 2, 3, 4, 5, 6, 7, 8]\n"
        "target: {metric: test_acc, value: 0.88}\nprune: {rungs: [2, 4], keep: 0.34, min_runs: 3}\n"
    )
    spec = load_sweep(path).spec
    store = LocalStore(str(tmp_path / "st"))
    rungs = Rungs(store, "r", spec)
    pruned = {}
    for x, (r2, r4) in CURVES.items():
        lines = [{"epoch": 1, "test_acc": r2 / 2}, {"epoch": 2, "test_acc": r2}]
        v = rungs.observe(f"x={x}", lines)
        if v is None:
            v = rungs.observe(f"x={x}", lines + [{"epoch": 3.5}, {"epoch": 4, "test_acc": r4}])
        if v is not None:
            pruned[x] = v.rung
            assert not v.kept and v.reported >= 3 and "pruned at epoch" in v.words("test_acc", "epoch")
    assert pruned == PRUNED_AT
    # a resumed attempt passes its rungs again: no second decision, the earlier verdict stands
    again = Rungs(store, "r", spec)  # a restarted controller reads the table back
    assert again.observe("x=2", [{"epoch": 2, "test_acc": 0.99}, {"epoch": 4, "test_acc": 0.99}]) is None
    assert again.verdict_of("x=2").rung == 2 and again.verdict_of("x=1") is None
    assert not again.due("x=2", {"epoch": 9})


@pytest.mark.timeout(600)
def test_a_pruned_local_sweep_reports_pruned_runs_and_time_to_target(orch, tmp_path):
    script = tmp_path / "curve.py"
    script.write_text(f"CURVES = {CURVES!r}\n" + CURVE_SCRIPT)
    rungs_file = orch.store("asha", "rungs.json")
    path = orch.sweep(f"""
        name: asha
        command: "{sys.executable} {script} {{x}} {rungs_file}"
        grid:
          x: [0, 1, 2, 3, 4, 5, 6, 7, 8]
        max_parallel: 1
        max_restarts: 0
        store: store
        target:
          metric: test_acc
          value: 0.88
        prune:
          rungs: [2, 4]
          keep: 0.34
          min_runs: 3
    """)
    r = orch("launch", str(path), timeout=550)
    assert r.code == 0, r.out + r.err
    states = {v["run_id"]: v for v in json.loads(orch("status", "asha", "--json").out)["runs"]}
    assert {rid for rid, v in states.items() if v["state"] == "pruned"} == {f"x={x}" for x in PRUNED_AT}, states
    assert {rid for rid, v in states.items() if v["state"] == "succeeded"} == {"x=0", "x=1"}
    assert states["x=1"]["reached"] is True and states["x=0"]["reached"] is False
    assert "pruned at epoch 4" in states["x=5"]["reason"] and "cutoff 0.9" in states["x=5"]["reason"]
    assert "✓ target" in orch("status", "asha", "--all").out

    out = tmp_path / "res"
    c = orch("collect", "asha", "--out", str(out))
    assert c.code == 0, c.err
    assert "target: 1 of 9 runs reached it; fastest x=1 in 40.0 s" in c.out, c.out
    assert "x=3: pruned at epoch 2" in c.out
    rows = {row["run_id"]: row for row in csv.DictReader(open(out / "runs.csv"))}
    assert rows["x=1"]["reached"] == "True" and float(rows["x=1"]["time_to_target_s"]) == 40.0
    assert float(rows["x=1"]["wall_to_target_s"]) > 0 and rows["x=0"]["time_to_target_s"] == ""
    assert rows["x=4"]["state"] == "pruned" and "cutoff" in rows["x=4"]["reason"]
    doc = json.loads((out / "runs.json").read_text())
    assert doc["summary"]["reached"] == 1 and doc["summary"]["fastest"] == ["x=1", 40.0]


def test_target_and_prune_errors_name_the_field_and_the_fix(orch, tmp_path):
    cases = {
        "target:\n  metric: score\n  value: 3\n": ("target.mode", "mode: max"),
        "prune:\n  rungs: [2, 4]\n": ("prune.metric", "metric: test_acc"),
        "prune:\n  metric: test_acc\n  rungs: [4, 2]\n": ("prune.rungs", "must increase"),
        "prune:\n  metric: test_acc\n  rungs: [2]\n  keep: 1.5\n": ("prune.keep", "less than 1"),
        "prune:\n  metric: test_acc\n  rung: [2]\n": ("prune", "rung"),
    }
    for i, (extra, (field, fix)) in enumerate(cases.items()):
        path = orch.sweep(f"name: bad{i}\ncommand: 'true'\nstore: store\n" + extra, name=f"bad{i}.yaml")
        r = orch("launch", str(path), "--dry-run")
        assert r.code == 2 and field in r.err and fix in r.err and "Traceback" not in r.err, (extra, r.err)


AWS_CURVE = textwrap.dedent("""
    import json, os, sys, time
    q = int(sys.argv[1])
    def line(epoch, acc):
        with open(os.path.join(os.environ["ORCH_RUN_DIR"], "metrics.jsonl"), "a") as f:
            line = {"epoch": epoch, "test_acc": acc, "elapsed_s": 2.0 * epoch, "time": time.time()}
            f.write(json.dumps(line) + "\\n")
    line(1, q / 10)
    if q < 5:
        time.sleep(600)  # a losing run: it waits to be pruned
    time.sleep(4)
    line(2, 0.95)
""")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_on_the_fake_cloud_a_pruned_run_loses_its_instance_and_dollars_match_the_ledger(
    orch, cloud, identity, tmp_path
):
    from orchestrator.backends.aws.cloud.pricing import ledger_cost
    from tests.conftest import ENDED_GAP_S, run_states
    from tests.fakecloud import BUCKET

    script = tmp_path / "curve.py"
    script.write_text(AWS_CURVE)
    extra = (
        "grid:\n  q: [9, 1]\nmax_parallel: 1\nmax_restarts: 0\ntarget:\n  metric: test_acc\n  value: 0.9\n"
        "prune:\n  at: epoch\n  rungs: [1]\n  keep: 0.5\n  min_runs: 2\n"
    )
    path = orch.sweep(
        cloud.sweep_yaml(
            "prunecloud", identity, f"{sys.executable} {script} {{q}}", extra=extra, heartbeat_s="1", sync_s="2"
        )
    )
    assert orch("launch", str(path), "--detach").code == 0
    from orchestrator.wait import retry_until

    def summary_says_pruned() -> (
        bool
    ):  # the summary record is written at the end of the pass that pruned (and released) it
        try:
            doc = json.loads(
                cloud.client("s3").get_object(Bucket=BUCKET, Key="sweeps/prunecloud/summary.json")["Body"].read()
            )
        except Exception:
            return False
        return any(r["run_id"] == "q=1" and r["state"] == "pruned" for r in doc["runs"])

    retry_until(summary_says_pruned, 400, 0.5, "the summary to say q=1 was pruned")
    assert not [i for i in cloud.instances("prunecloud") if i["tags"].get("orch:run") == "q=1"], cloud.instances(
        "prunecloud"
    )
    # each instance said it signals its one rung by tag, and its agent removed the rung's tag once its record had
    # the value there (the controller reads a record when that tag goes, not at every pass; it removes no tag)
    gone = [i["tags"] for i in cloud.instances("prunecloud", states=("shutting-down", "terminated"))]
    assert gone and all(t["orch:rungs"] == "1" and "orch:rung:1" not in t for t in gone), gone
    retry_until(
        lambda: run_states(orch, "prunecloud", gap=ENDED_GAP_S)["q=9"]["state"] == "succeeded",
        120,
        0.5,
        "q=9 to succeed",
    )
    out = tmp_path / "res"
    c = orch("collect", "prunecloud", "--out", str(out))
    assert c.code == 0, c.err
    doc = json.loads((out / "runs.json").read_text())
    rows = {r["run_id"]: r for r in doc["runs"]}
    ledger = json.loads(cloud.client("s3").get_object(Bucket=BUCKET, Key="sweeps/prunecloud/cost.json")["Body"].read())
    assert doc["spend_usd"] == pytest.approx(ledger_cost(ledger), abs=1e-3) and doc["spend_usd"] > 0
    # dollars to the target stop at the line that met it (epoch 1): the run's instance ran on after it (the
    # command's last line comes 4 s later), and all of that is in its cost, none in its dollars to the target
    assert rows["q=9"]["reached"] is True and 0 < rows["q=9"]["usd_to_target"] < rows["q=9"]["cost_usd"], rows["q=9"]
    assert rows["q=1"]["state"] == "pruned" and "cutoff 0.9" in rows["q=1"]["reason"]
    assert doc["summary"]["pruned_usd"] > 0 and doc["summary"]["on_demand_usd"] > doc["spend_usd"]
    assert "on demand the same hours would have cost" in c.out
    assert orch("down", "prunecloud", timeout=300).code == 0


def test_a_relaunch_may_change_the_target_and_collect_by_name_uses_the_new_one(orch, tmp_path):
    script = tmp_path / "one_line.py"
    script.write_text(
        "import json, os\nopen(os.path.join(os.environ['ORCH_RUN_DIR'], 'metrics.jsonl'), 'a').write("
        "json.dumps({'epoch': 1, 'test_acc': 0.92, 'elapsed_s': 3.0}) + '\\n')\n"
    )
    text = (
        f"name: moving\ncommand: '{sys.executable} {script}'\nstore: store\ntarget:\n  metric: test_acc\n  value: "
        "VALUE\n"
    )
    assert orch("launch", str(orch.sweep(text.replace("VALUE", "0.95")))).code == 0
    first = orch("collect", "moving", "--out", str(tmp_path / "a"))
    assert "target: 0 of 1 runs reached it" in first.out, first.out
    again = orch("launch", str(orch.sweep(text.replace("VALUE", "0.9"))))
    assert again.code == 0, again.err
    second = orch("collect", "moving", "--out", str(tmp_path / "b"))
    assert "target: 1 of 1 runs reached it; fastest run in 3.0 s" in second.out, second.out
    pruned = text.replace("VALUE", "0.8") + "prune:\n  rungs: [1]\n  min_runs: 1\n"
    refused = orch("launch", str(orch.sweep(pruned)), "--dry-run")
    assert refused.code == 2 and "changed: prune, target.value" in refused.err, refused.err


@pytest.mark.timeout(300)
def test_the_agent_reports_a_line_at_a_rung_at_once_not_at_the_next_heartbeat(orch, tmp_path, monkeypatch):
    """The controller decides at rungs from the record: a line that passes a rung is written into the
    record when it appears, so a losing run is stopped without waiting for a heartbeat (here an hour)."""
    from dataclasses import replace

    from orchestrator.backends.local.backend import LocalBackend
    from orchestrator.store.status import RUNNING, STARTING, RunStatus, read_status, write_if
    from orchestrator.wait import retry_until

    monkeypatch.setenv("ORCH_HOME", str(orch.home))
    monkeypatch.setenv("ORCH_TMUX_SOCKET", orch.socket)
    go = tmp_path / "go"
    script = tmp_path / "lines.py"
    script.write_text(
        textwrap.dedent(f"""
        import json, os, time
        with open(os.path.join(os.environ["ORCH_RUN_DIR"], "metrics.jsonl"), "a") as f:
            for epoch in (1, 2):
                f.write(json.dumps({{"epoch": epoch, "test_acc": epoch / 10}}) + "\\n")
        while not os.path.exists({str(go)!r}):
            time.sleep(0.1)
    """)
    )
    path = tmp_path / "rung.yaml"
    path.write_text(
        f"name: rung\ncommand: '{sys.executable} {script}'\nstore: {tmp_path / 'st'}\n"
        "prune: {metric: test_acc, rungs: [2], min_runs: 1}\n"
    )
    sweep = load_sweep(path)
    store = LocalStore(str(tmp_path / "st"))
    run = sweep.runs[0]
    assert write_if(
        store, "rung", RunStatus(run_id=run.run_id, state=STARTING, attempt=1), None
    )  # the controller's claim
    backend = LocalBackend(sweep)
    task = replace(backend.new_task(run.run_id, 1, run.command, json.dumps(run.params)), heartbeat_s=3600.0)
    assert task.rungs_at == "epoch" and task.rungs == [2.0]
    backend.start(task)
    try:
        retry_until(
            lambda: read_status(store, "rung", run.run_id).last_metrics.get("epoch") == 2,
            120,
            0.2,
            "the line at epoch 2 in the record (heartbeats come hourly)",
        )
        assert read_status(store, "rung", run.run_id).state == RUNNING
    finally:
        go.touch()
    retry_until(lambda: read_status(store, "rung", run.run_id).state == "succeeded", 120, 0.2, "the run to end")


def _rungs(tmp_path, prune: str, target: str = "") -> Rungs:
    path = tmp_path / "s.yaml"
    path.write_text(f"name: r\ncommand: 'true'\nstore: st\ngrid:\n  x: [0, 1, 2, 3]\n{target}prune: {prune}\n")
    return Rungs(LocalStore(str(tmp_path / "st")), "r", load_sweep(path).spec)


def test_pruning_a_metric_to_minimise_stops_the_highest_values(tmp_path):
    for i, prune in enumerate(
        (
            "{metric: val_loss, mode: min, rungs: [1], keep: 0.5, min_runs: 2}",
            "{metric: val_loss, rungs: [1], keep: 0.5, min_runs: 2}",  # min from the name
        )
    ):
        (tmp_path / str(i)).mkdir()
        rungs = _rungs(tmp_path / str(i), prune)
        verdicts = {r: rungs.observe(r, [{"epoch": 1, "val_loss": v}]) for r, v in (("a", 0.2), ("b", 0.9))}
        assert verdicts["a"] is None  # alone at the rung: no decision
        assert verdicts["b"] is not None and not verdicts["b"].kept and verdicts["b"].cutoff == 0.2
        assert rungs.observe("c", [{"epoch": 1, "val_loss": 0.1}]) is None  # the lowest goes on
        d = rungs.observe("d", [{"epoch": 1, "val_loss": 0.15}])  # n=4, k=2: cutoff 0.15 (c 0.1, d 0.15)
        assert d is None and rungs.values["1"] == {"a": 0.2, "b": 0.9, "c": 0.1, "d": 0.15}
        e = rungs.observe("e", [{"epoch": 1, "val_loss": 0.3}])
        assert e is not None and e.cutoff == 0.15 and rungs.mode == "min"


def test_a_value_equal_to_the_cutoff_is_kept(tmp_path):
    rungs = _rungs(tmp_path, "{metric: test_acc, rungs: [2], keep: 0.5, min_runs: 2}")
    assert rungs.observe("a", [{"epoch": 2, "test_acc": 0.5}]) is None
    assert rungs.observe("b", [{"epoch": 2, "test_acc": 0.5}]) is None  # n=2, k=1: the cutoff is 0.5, b ties it
    lower = rungs.observe("c", [{"epoch": 2, "test_acc": 0.4999}])
    assert lower is not None and lower.cutoff == 0.5 and "b" not in rungs.pruned


def test_keep_one_is_refused_naming_the_field(orch):
    path = orch.sweep("name: k1\ncommand: 'true'\nstore: store\nprune:\n  metric: test_acc\n  rungs: [2]\n  keep: 1\n")
    r = orch("launch", str(path), "--dry-run")
    assert r.code == 2 and "prune.keep" in r.err and "Traceback" not in r.err, r.err
    assert not (orch.tmp / "store").exists()


def test_non_finite_negative_and_huge_values_never_count(tmp_path):
    from orchestrator.control.target import to_target
    from orchestrator.sweep.spec import TargetSection

    target = TargetSection(metric="test_acc", value=0.9)
    assert not target.met({"test_acc": float("inf")}) and not target.met({"test_acc": float("nan")})
    assert not target.met({"test_acc": 10**400})  # larger than any float: no value (and no crash)
    for elapsed in (-5, 1e30, float("inf"), 10**400):
        t = to_target(target, [{"test_acc": 0.95, "elapsed_s": elapsed}], None, None, "r")
        assert t.reached and t.time_to_target_s is None, (elapsed, t)
    rungs = _rungs(tmp_path, "{metric: test_acc, rungs: [1], keep: 0.5, min_runs: 1}")
    huge = [{"epoch": 10**400, "test_acc": 10**400}, {"epoch": 1, "test_acc": float("inf")}]
    assert not rungs.due("a", huge[0]) and rungs.observe("a", huge) is None and rungs.values["1"] == {}


def test_time_to_target_is_the_first_meeting_lines_and_wall_time_counts_from_the_first_claim(tmp_path):
    from orchestrator.control.target import to_target
    from orchestrator.sweep.spec import TargetSection

    t0 = 1_700_000_000.0
    lines = [
        {"epoch": 1, "test_acc": 0.5, "elapsed_s": 10.0, "time": t0 + 30},
        {"epoch": 2, "test_acc": 0.91, "elapsed_s": 20.0, "time": t0 + 50},
        {"epoch": 3, "test_acc": 0.89, "elapsed_s": 30.0, "time": t0 + 70},
        {"epoch": 4, "test_acc": 0.95, "elapsed_s": 40.0, "time": t0 + 90},
    ]
    t = to_target(TargetSection(metric="test_acc", value=0.9), lines, t0, None, "r")
    assert (t.reached, t.time_to_target_s, t.wall_to_target_s) == (True, 20.0, 50.0)
    loss = to_target(
        TargetSection(metric="val_loss", value=0.3),
        [{"val_loss": 0.5}, {"val_loss": 0.3, "time": t0 + 5}],
        t0,
        None,
        "r",
    )
    assert (loss.reached, loss.wall_to_target_s, loss.time_to_target_s) == (True, 5.0, None)


def test_a_resumed_runs_wall_time_to_target_counts_from_its_first_claim(orch, tmp_path):
    """Attempt 1 fails after a line; attempt 2 writes several lines, two of which meet the target:
    the times are the first meeting line's, and wall time counts from attempt 1's claim."""
    script = tmp_path / "resume.py"
    script.write_text(
        textwrap.dedent("""
        import json, os, sys, time
        path = os.path.join(os.environ["ORCH_RUN_DIR"], "metrics.jsonl")
        def line(**kw):
            with open(path, "a") as f:
                f.write(json.dumps({**kw, "time": time.time()}) + "\\n")
        if os.environ["ORCH_ATTEMPT"] == "1":
            line(epoch=1, test_acc=0.5, elapsed_s=7.0)
            sys.exit(3)
        line(epoch=2, test_acc=0.8, elapsed_s=11.0)
        line(epoch=3, test_acc=0.93, elapsed_s=13.0)
        line(epoch=4, test_acc=0.97, elapsed_s=17.0)
    """)
    )
    path = orch.sweep(
        f"name: resumed\ncommand: '{sys.executable} {script}'\nstore: store\nmax_restarts: 1\n"
        "target:\n  metric: test_acc\n  value: 0.9\n"
    )
    r = orch("launch", str(path))
    assert r.code == 0, r.out + r.err
    record = json.loads(orch.store("resumed", ".orch", "run", "status.json").read_text())
    lines = [json.loads(x) for x in orch.store("resumed", "run", "metrics.jsonl").read_text().splitlines()]
    assert record["attempt"] == 2 and record["first_started_at"] < lines[0]["time"]  # attempt 1's claim
    out = tmp_path / "res"
    assert orch("collect", "resumed", "--out", str(out)).code == 0
    row = json.loads((out / "runs.json").read_text())["runs"][0]
    assert row["time_to_target_s"] == 13.0
    assert row["wall_to_target_s"] == round(lines[2]["time"] - record["first_started_at"], 3)


def test_status_drops_marks_of_a_target_a_relaunch_changed(orch, tmp_path):
    script = tmp_path / "one_line.py"
    script.write_text(
        "import json, os\nopen(os.path.join(os.environ['ORCH_RUN_DIR'], 'metrics.jsonl'), 'a').write("
        "json.dumps({'epoch': 1, 'test_acc': 0.92}) + '\\n' + json.dumps({'epoch': 2, 'test_acc': 0.5}) + '\\n')\n"
    )
    text = f"name: marks\ncommand: '{sys.executable} {script}'\nstore: store\ntarget:\n  metric: test_acc\n  value: V\n"
    assert orch("launch", str(orch.sweep(text.replace("V", "0.9")))).code == 0
    assert "✓ target" in orch("status", "marks").out
    assert orch("launch", str(orch.sweep(text.replace("V", "0.95")))).code == 0
    assert "✓ target" not in orch("status", "marks").out  # the old mark is of the old target
    assert json.loads(orch("status", "marks", "--json").out)["runs"][0]["reached"] is False
    assert orch("launch", str(orch.sweep(text.replace("V", "0.91")))).code == 0
    assert "✓ target" in orch("status", "marks").out  # an earlier line (not the newest) meets the new one


def test_odd_numbers_in_metrics_lines_neither_crash_nor_count(orch, tmp_path):
    """Infinity, a negative or absurd elapsed time and an integer too large for a float, with prune: and
    target:, through launch, a relaunch and collect."""
    script = tmp_path / "odd.py"
    script.write_text(
        textwrap.dedent("""
        import json, os, sys
        q = int(sys.argv[1])
        lines = {
            0: [{"epoch": 1, "test_acc": float("inf"), "elapsed_s": 1.0}, {"epoch": 10**400, "test_acc": 10**400}],
            1: [{"epoch": 1, "test_acc": 0.95, "elapsed_s": 1e30}],
            2: [{"epoch": 1, "test_acc": 0.96, "elapsed_s": -5}],
        }[q]
        with open(os.path.join(os.environ["ORCH_RUN_DIR"], "metrics.jsonl"), "a") as f:
            f.writelines(json.dumps(line) + "\\n" for line in lines)
    """)
    )
    path = orch.sweep(
        f"name: odd\ncommand: '{sys.executable} {script} {{q}}'\nstore: store\ngrid:\n  q: [0, 1, 2]\n"
        "max_restarts: 0\ntarget:\n  metric: test_acc\n  value: 0.9\nprune:\n  rungs: [1]\n  keep: 0.5\n  min_runs: 2\n"
    )
    for _ in range(2):  # a relaunch reads the same lines again
        r = orch("launch", str(path))
        assert r.code == 0 and "Traceback" not in r.err, r.out + r.err
    states = {v["run_id"]: v for v in json.loads(orch("status", "odd", "--json").out)["runs"]}
    assert states["q=0"]["reached"] is False and states["q=1"]["reached"] is True, states
    c = orch("collect", "odd", "--out", str(tmp_path / "res"))
    assert c.code == 0 and "Traceback" not in c.err, c.err
    assert "target: 2 of 3 runs reached it." in c.out and "fastest" not in c.out, c.out


def test_the_value_at_a_rung_is_the_first_line_at_or_past_it_however_the_lines_come(tmp_path):
    """The agent's watch over the run's own file: a burst of epochs 1-5 gives rung 2 epoch 2's value;
    a line over 16 KB (a thousand per-class accuracies) is read whole; each read takes only what was
    appended since the last one."""
    from orchestrator.host.attempt import RungWatch
    from orchestrator.store.status import RunStatus

    path = tmp_path / "metrics.jsonl"
    watch = RungWatch(path, "epoch", [2.0, 4.0], "acc")
    burst = [{"epoch": e, "acc": a} for e, a in ((1, 0.1), (2, 0.2), (3, 0.3), (4, 0.9), (5, 1.0))]
    path.write_text("".join(json.dumps(line) + "\n" for line in burst[:1]))
    assert not watch.passed() and watch.offset == path.stat().st_size
    with open(path, "a") as f:
        f.write("".join(json.dumps(line) + "\n" for line in burst[1:]))
    assert watch.passed() and watch.offset == path.stat().st_size
    status = RunStatus(run_id="r")
    watch.report(status)
    assert status.at_rungs == {"2": 0.2, "4": 0.9} and status.metric_seen and status.last_metrics["epoch"] == 5

    wide = {"epoch": 6, "acc": 0.7, **{f"class_{i:04d}_acc": i / 1000 for i in range(1000)}}
    with open(path, "a") as f:
        f.write(json.dumps(wide) + "\n")
    assert len(json.dumps(wide)) > 16384
    before = watch.offset
    watch.report(status)
    assert status.last_metrics["epoch"] == 6 and len(status.last_metrics) == 1002
    assert watch.offset == path.stat().st_size > before  # read from where the last read ended

    late = RungWatch(path, "epoch", [6.0], "acc")  # its first line at or past the rung is the wide one
    late.report(status)
    assert status.at_rungs == {"6": 0.7}
    unterminated = tmp_path / "cut.jsonl"
    unterminated.write_text('{"epoch": 1, "acc": 0.5}\n{"epoch": 2, "acc": 0.6')  # still being written
    cut = RungWatch(unterminated, "epoch", [2.0], "acc")
    assert not cut.passed()
    with open(unterminated, "a") as f:
        f.write("}")  # whole now, though no newline follows yet
    assert cut.passed() and cut.at_rungs == {"2": 0.6}


def test_a_line_past_several_rungs_at_once_gives_each_of_them_its_value(tmp_path):
    """A run that logs every few epochs (or an attempt resumed past its rungs) passes several rungs on one line: it
    is the first line at or past each of them, so each gets its value and the controller compares the run at all."""
    from orchestrator.host.attempt import RungWatch

    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"epoch": 5, "acc": 0.7}) + "\n")
    watch = RungWatch(path, "epoch", [1.0, 2.0, 4.0, 8.0], "acc")
    assert watch.passed() and watch.at_rungs == {"1": 0.7, "2": 0.7, "4": 0.7} and watch.pending == [8.0]


@pytest.mark.timeout(300)
def test_a_burst_of_lines_is_compared_at_the_rung_with_the_rungs_line(orch, tmp_path):
    """Epochs 1-5 at once, rungs [2]: the run is recorded at rung 2 with epoch 2's value, not with the
    newest line's (which the store's copy of the file, synced later, lacks at first)."""
    script = tmp_path / "burst.py"
    script.write_text(
        textwrap.dedent("""
        import json, os, sys, time
        rungs_file = sys.argv[1]
        with open(os.path.join(os.environ["ORCH_RUN_DIR"], "metrics.jsonl"), "a") as f:
            for epoch, acc in ((1, 0.1), (2, 0.2), (3, 0.3), (4, 0.9), (5, 1.0)):
                f.write(json.dumps({"epoch": epoch, "test_acc": acc}) + "\\n")
        for _ in range(3000):  # until the controller has recorded the run at the rung
            try:
                if os.environ["ORCH_RUN_ID"] in json.load(open(rungs_file))["values"]["2"]:
                    break
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(0.1)
    """)
    )
    rungs_file = orch.store("burst", "rungs.json")
    path = orch.sweep(
        f"name: burst\ncommand: '{sys.executable} {script} {rungs_file}'\nstore: store\n"
        "prune:\n  metric: test_acc\n  rungs: [2]\n  min_runs: 1\n"
    )
    r = orch("launch", str(path), timeout=250)
    assert r.code == 0, r.out + r.err
    assert json.loads(rungs_file.read_text())["values"]["2"] == {"run": 0.2}


class _CountingStore(LocalStore):
    """A folder store that counts reads of metrics files (what a pass downloads)."""

    metrics_reads = 0

    def get_bytes(self, key):
        if key.endswith("/metrics.jsonl"):
            type(self).metrics_reads += 1
        return super().get_bytes(key)


def test_a_prune_metric_no_line_carries_is_warned_of_once_and_no_pass_reads_metrics_files(
    tmp_path, monkeypatch, caplog
):
    import logging
    import time

    from orchestrator.control.controller import Controller
    from orchestrator.control.state import State
    from orchestrator.store.status import RUNNING, RunStatus, write_status
    from tests.unit.store.test_records import WakingAgent

    class Hosted(WakingAgent):
        def list(self):
            return [Host(run_id="run", host_id="h1", address="localhost", attempt=1)]

        def spend(self):
            return 0.0

    from orchestrator.backends.base import Host

    monkeypatch.setenv("ORCH_HOME", str(tmp_path / "home"))
    path = tmp_path / "sweep.yaml"
    path.write_text(
        "name: rec\ncommand: 'true'\nstore: store\nprune:\n  metric: val_acc\n  rungs: [2]\n  min_runs: 1\n"
    )
    sweep = load_sweep(path)
    store = _CountingStore(str(tmp_path / "store"))
    record = RunStatus(run_id="run", state=RUNNING, attempt=1, started_at=time.time(), heartbeat=time.time())
    record.last_metrics, record.at_rungs, record.metric_seen = {"epoch": 3, "train_loss": 0.5}, {}, False
    write_status(store, "rec", record)
    controller = Controller(sweep, Hosted(store, tmp_path), store, State(tmp_path / "home"))
    controller.prepare()
    with caplog.at_level(logging.WARNING, logger="orch.controller"):
        for _ in range(3):
            controller.step()
    warned = [r.getMessage() for r in caplog.records if "val_acc" in r.getMessage()]
    assert len(warned) == 1 and "train_loss" in warned[0] and "prune.metric" in warned[0], warned
    assert _CountingStore.metrics_reads == 0


def test_a_verdict_stands_for_a_resumed_attempt_and_after_a_lost_write(tmp_path, monkeypatch):
    """rungs.json holds a verdict whose record write did not land (a lost race, or a crash between the
    two): a run due for attempt 2 is not started, and a running one is pruned, by that verdict."""
    import time

    from orchestrator.backends.base import Host
    from orchestrator.control.controller import Controller
    from orchestrator.control.state import State
    from orchestrator.store.status import RUNNING, RunStatus, read_status, write_status
    from tests.unit.store.test_records import WakingAgent

    class Hosts(WakingAgent):
        stopped: list = []

        def list(self):
            return [Host(run_id="x=1", host_id="h1", address="localhost", attempt=1)]

        def spend(self):
            return 0.0

        def stop(self, run_id, reason):
            self.stopped.append(run_id)
            return True

    monkeypatch.setenv("ORCH_HOME", str(tmp_path / "home"))
    path = tmp_path / "sweep.yaml"
    path.write_text(
        "name: rec\ncommand: 'true'\nstore: store\ngrid:\n  x: [0, 1, 2]\nmax_parallel: 3\n"
        "prune: {metric: test_acc, rungs: [1], keep: 0.5, min_runs: 1}\n"
    )
    sweep = load_sweep(path)
    store = LocalStore(str(tmp_path / "store"))
    rungs = Rungs(store, "rec", sweep.spec)
    assert rungs.observe("x=2", [{"epoch": 1, "test_acc": 0.9}]) is None
    for rid in ("x=0", "x=1"):
        assert rungs.observe(rid, [{"epoch": 1, "test_acc": 0.1}]) is not None  # the verdict, in rungs.json
    now = time.time()
    write_status(store, "rec", RunStatus(run_id="x=0", state="interrupted", attempt=1, started_at=now - 60))
    write_status(store, "rec", RunStatus(run_id="x=1", state=RUNNING, attempt=1, started_at=now, heartbeat=now))
    write_status(store, "rec", RunStatus(run_id="x=2", state="succeeded", attempt=1, started_at=now, finished_at=now))
    backend = Hosts(store, tmp_path)
    controller = Controller(sweep, backend, store, State(tmp_path / "home"))
    controller.prepare()
    controller.step()
    assert backend.started == [] and "x=1" in backend.stopped
    for rid in ("x=0", "x=1"):
        after = read_status(store, "rec", rid)
        assert after.state == "pruned" and after.attempt == 1 and "cutoff 0.9" in after.reason, after


def test_collect_of_a_thousand_metric_keys_draws_a_bounded_figure_and_names_what_it_left_out(tmp_path):
    from orchestrator.control.collect import Results, RunResult, write_outputs
    from orchestrator.control.curves import MAX_PANELS

    lines = [
        {"epoch": e, "test_acc": e / 4, **{f"class_{i:04d}_acc": i / 1000 for i in range(1000)}} for e in (1, 2, 3)
    ]
    run = RunResult("run", "succeeded", 1, {}, lines[-1], {}, 1.0, curves=lines)
    results = Results(sweep="wide", runs=[run])
    paths = write_outputs(results, tmp_path / "out")
    assert (tmp_path / "out" / "curves.png").exists() and len(paths) == 3
    assert len(results.left_out) == 1001 - MAX_PANELS and "test_acc" not in results.left_out  # `epoch` is an axis
    assert json.loads((tmp_path / "out" / "runs.json").read_text())["curves_left_out"] == results.left_out


def test_a_run_that_reached_the_target_and_then_failed_is_counted_as_such(orch, tmp_path):
    script = tmp_path / "reach.py"
    script.write_text(
        "import json, os, sys\n"
        "with open(os.path.join(os.environ['ORCH_RUN_DIR'], 'metrics.jsonl'), 'a') as f:\n"
        "    f.write(json.dumps({'epoch': 1, 'test_acc': 0.9}) + '\\n')\n"
        "sys.exit(int(sys.argv[1]))\n"
    )
    path = orch.sweep(
        f"name: rf\ncommand: '{sys.executable} {script} {{code}}'\nstore: store\ngrid:\n  code: [0, 1]\n"
        "max_restarts: 0\ntarget:\n  metric: test_acc\n  value: 0.5\n"
    )
    orch("launch", str(path))
    c = orch("collect", "rf", "--out", str(tmp_path / "res"))
    assert c.code == 0, c.out + c.err
    assert "target: 2 of 2 runs reached it (1 of them before failing)" in c.out, c.out
