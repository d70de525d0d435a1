"""`orch collect`'s files: what curves.png draws and which runs it names, and that the results outlive a plot that
cannot be drawn. The runs' records and metrics lines are written into the store as the agent writes them."""

from __future__ import annotations

import csv
import json
import struct
import sys
import time

from orchestrator.backends.registry import load_sweep
from orchestrator.store import layout
from orchestrator.store.folder import LocalStore
from orchestrator.store.status import RunStatus, write_status


def _ended(orch, path, lines_of) -> None:
    """Every run of the sweep at `path` succeeded, having logged `lines_of(run_id)`."""
    sweep = load_sweep(path)
    store = LocalStore(str(orch.store()))
    now = time.time()
    for run in sweep.runs:
        status = RunStatus(run_id=run.run_id, state="succeeded", attempt=1, started_at=now - 60, finished_at=now)
        write_status(store, sweep.spec.name, status)
        text = "".join(json.dumps(line) + "\n" for line in lines_of(run.run_id))
        store.put_bytes(layout.metrics_key(sweep.spec.name, run.run_id), text.encode())


def _png_size(path) -> tuple[int, int]:
    """(width, height) from the PNG's header (its IHDR chunk)."""
    return struct.unpack(">II", path.read_bytes()[16:24])


def test_curves_png_draws_the_sweeps_metric_accuracies_and_losses_against_epoch_and_the_rest_on_request(orch):
    path = orch.sweep("""
        name: pic
        command: 'true'
        grid:
          lr: [0.1, 0.2]
        store: store
        target: {metric: perplexity, value: 20, mode: min}
    """)

    def lines(run_id):
        lr = float(run_id.split("=")[1])
        return [
            {
                "step": 100 * e,
                "epoch": e,
                "batch_size": 128,
                "time": 1.79e9 + 30 * e,
                "images_per_s": 5000.0,
                "perplexity": 60 / e * lr * 10,
                "train_loss": 2.0 / e,
                "val_accuracy": 0.5 + 0.1 * e * lr,
            }
            for e in range(1, 5)
        ]

    _ended(orch, path, lines)
    out = orch.tmp / "res"
    r = orch("collect", str(path), "--out", str(out))
    assert r.code == 0, r.out + r.err
    doc = json.loads((out / "runs.json").read_text())
    assert doc["curves"]["metrics"] == ["perplexity", "val_accuracy", "train_loss"], doc.get("curves")
    assert _png_size(out / "curves.png")[1] == 396, _png_size(out / "curves.png")  # one row of panels (3.6 in)
    assert "not drawn: batch_size, time, images_per_s (draw them with --metrics, e.g. --metrics batch_size)" in r.out
    asked = orch("collect", str(path), "--out", str(out), "--metrics", "images_per_s,time")
    assert asked.code == 0, asked.out + asked.err
    assert json.loads((out / "runs.json").read_text())["curves"]["metrics"] == ["images_per_s", "time"]
    typo = orch("collect", str(path), "--out", str(orch.tmp / "typo"), "--metrics", "val_acc")
    assert typo.code == 2 and "--metrics: no run logged val_acc" in typo.err and "Traceback" not in typo.err, typo
    assert not (orch.tmp / "typo" / "runs.json").exists()


def test_curves_png_labels_the_best_runs_by_the_sweeps_metric_in_its_direction(orch):
    """12 runs, 10 labelled: the best by the target's test_acc (max), never by `epoch`, which comes first in a line;
    without a sweep metric, by the accuracy/loss rule (a validation loss: lowest first)."""
    path = orch.sweep("""
        name: many
        command: 'true'
        grid:
          q: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]
        store: store
        target: {metric: test_acc, value: 0.99}
    """)

    def lines(run_id):  # the more epochs a run logged, the worse its accuracy
        q = int(run_id.split("=")[1])
        return [{"epoch": e, "test_acc": 0.9 - q / 100, "val_loss": 1 + q / 10} for e in range(1, q + 2)]

    _ended(orch, path, lines)
    r = orch("collect", str(path), "--out", str(orch.tmp / "res"))
    assert r.code == 0, r.out + r.err
    curves = json.loads((orch.tmp / "res" / "runs.json").read_text())["curves"]
    assert curves["ranked_by"] == ["test_acc", "max"], curves
    assert curves["labelled"] == [f"q={q}" for q in range(10)], curves
    assert "labelled: the best 10 by test_acc (max)" in r.out, r.out

    plain = orch.sweep(path.read_text().replace("name: many", "name: plain").split("target:")[0], "plain.yaml")
    _ended(orch, plain, lines)
    r = orch("collect", str(plain), "--out", str(orch.tmp / "res2"))
    assert r.code == 0, r.out + r.err
    curves = json.loads((orch.tmp / "res2" / "runs.json").read_text())["curves"]
    assert curves["ranked_by"] == ["test_acc", "max"], curves  # an accuracy before a loss

    loss_only = orch.sweep(plain.read_text().replace("name: plain", "name: lossy"), "lossy.yaml")
    _ended(orch, loss_only, lambda run_id: [{"epoch": 1, "val_loss": 9 - int(run_id.split("=")[1])}])
    r = orch("collect", str(loss_only), "--out", str(orch.tmp / "res3"))
    curves = json.loads((orch.tmp / "res3" / "runs.json").read_text())["curves"]
    assert curves["ranked_by"] == ["val_loss", "min"] and curves["labelled"][0] == "q=11", curves


def test_collect_prints_its_table_and_skips_a_plot_matplotlib_cannot_draw(orch):
    path = orch.sweep("name: huge\ncommand: 'true'\nstore: store\ngrid:\n  q: [1]\n")
    _ended(orch, path, lambda _: [{"epoch": 1, "test_acc": 1e308}, {"epoch": 2, "test_acc": -1e308}])
    out = orch.tmp / "res"
    out.mkdir()
    (out / "curves.png").write_bytes(b"an earlier collect's picture")
    r = orch("collect", str(path), "--out", str(out))
    assert r.code == 0 and "Traceback" not in r.err, r.out + r.err
    assert "│ q=1" in r.out and "succeeded" in r.out, r.out  # the table
    assert r.out.count("curves.png not drawn: matplotlib cannot draw these values (") == 1, r.out
    assert (out / "runs.csv").exists() and not (out / "curves.png").exists()


def test_a_metric_named_like_a_search_param_keeps_the_sampled_value_in_its_column(orch, tmp_path):
    """The trainer logs its own `lr` in a search over `lr`: runs.csv and runs.json keep the value the sampler
    chose under `lr` and the logged one as `metric.lr`, as for a grid."""
    script = tmp_path / "logs_lr.py"
    script.write_text(
        "import json, os\n"
        "with open(os.path.join(os.environ['ORCH_RUN_DIR'], 'metrics.jsonl'), 'a') as f:\n"
        "    f.write(json.dumps({'epoch': 1, 'lr': 123.0, 'score': 0.5}) + '\\n')\n"
    )
    path = orch.sweep(f"""
        name: lrsearch
        command: "{sys.executable} {script}"
        store: store
        search: {{sampler: random, trials: 2, metric: score, mode: max, space: {{lr: {{low: 0.1, high: 1.0}}}}}}
    """)
    assert orch("launch", str(path)).code == 0
    r = orch("collect", "lrsearch", "--out", str(tmp_path / "out"))
    assert r.code == 0, r.out + r.err
    rows = json.loads((tmp_path / "out" / "runs.json").read_text())["runs"]
    assert [0.1 <= row["lr"] <= 1.0 and row["metric.lr"] == 123.0 for row in rows] == [True, True], rows
    with open(tmp_path / "out" / "runs.csv") as f:
        assert all(0.1 <= float(row["lr"]) <= 1.0 for row in csv.DictReader(f))
