"""Benchmark: `prune:` (asynchronous successive halving) against the whole grid.

27 runs of synthetic learning curves (run q's test_acc at epoch e is q/30 * (1 - 0.6**e): the order of
the runs never changes, so the best configuration is known), 8 epochs of 3 s each, 3 at a time on
the local backend: once without `prune:`, once with `prune: {rungs: [1, 2, 4], keep: 0.34, min_runs: 3}`
(rungs that double, the shape of the README's [2, 4, 8] for 8 epochs), and once with rungs [1, 3]
(a reduction factor of 3). Prints total run-seconds (each record's start to end: a pruned run counts
until the controller's verdict) and the best final test_acc side by side. Goal: at most 40% of the
run-seconds for the same best configuration.

What is left above ASHA's own share is the reaction: a line at a rung reaches the record at once
(the agent reports it, not at the next heartbeat), and the controller's next pass (every 1 s here)
decides. With zero reaction, this arrival order gives 0.34 of the grid for [1, 2, 4] and 0.40 for [1, 3].

    scripts/test.sh tests/bench/test_bench_prune.py -m bench -s
"""

from __future__ import annotations

import json
import textwrap

import pytest

pytestmark = pytest.mark.bench

CURVE = textwrap.dedent("""
    import json, os, sys, time
    q = int(sys.argv[1])
    t0 = time.time()
    for epoch in range(1, 9):
        time.sleep(3.0)
        with open(os.path.join(os.environ["ORCH_RUN_DIR"], "metrics.jsonl"), "a") as f:
            f.write(json.dumps({"epoch": epoch, "test_acc": q / 30 * (1 - 0.6 ** epoch), "elapsed_s": time.time() - t0,
                                "time": time.time()}) + "\\n")
""")


ORDER = [
    13,
    4,
    22,
    8,
    17,
    1,
    25,
    10,
    6,
    19,
    2,
    15,
    23,
    0,
    11,
    20,
    5,
    26,
    9,
    14,
    3,
    18,
    24,
    7,
    12,
    21,
    16,
]  # a shuffle of 0..26:
# in the grid's own order (worst first) every run would be the best yet at each rung, and ASHA could prune nothing


def sweep(orch, tmp_path, name: str, prune: str) -> dict:
    script = tmp_path / "curve.py"
    script.write_text(CURVE)
    path = orch.sweep(
        f"name: {name}\ncommand: 'python3 {script} {{q}}'\ngrid:\n  q: {ORDER}\nmax_parallel: 3\n"
        f"max_restarts: 0\nstore: store\n{prune}",
        name=f"{name}.yaml",
    )
    r = orch("launch", str(path), timeout=900)
    assert r.code == 0, r.out + r.err
    out = tmp_path / name
    assert orch("collect", name, "--out", str(out)).code == 0
    rows = json.loads((out / "runs.json").read_text())["runs"]
    finished = [r for r in rows if r["state"] == "succeeded"]
    best = max(finished, key=lambda r: r["test_acc"])
    return {
        "run_s": sum(r["elapsed_s"] or 0 for r in rows),
        "best": best["run_id"],
        "best_acc": best["test_acc"],
        "pruned": sum(r["state"] == "pruned" for r in rows),
    }


@pytest.mark.timeout(1800)
def test_pruning_costs_a_fraction_of_the_grid(orch, tmp_path):
    full = sweep(orch, tmp_path, "grid", "")
    asha = sweep(
        orch, tmp_path, "asha", "prune:\n  metric: test_acc\n  rungs: [1, 2, 4]\n  keep: 0.34\n  min_runs: 3\n"
    )
    three = sweep(orch, tmp_path, "asha3", "prune:\n  metric: test_acc\n  rungs: [1, 3]\n  keep: 0.34\n  min_runs: 3\n")
    print("\n27 runs x 8 epochs of 3 s, 3 at a time:")
    print(
        f"  whole grid:          {full['run_s']:.1f} run-seconds, best {full['best']} test_acc {full['best_acc']:.4f}"
    )
    for label, r in (("rungs [1, 2, 4]", asha), ("rungs [1, 3]", three)):
        print(
            f"  prune, {label}: {r['run_s']:.1f} run-seconds ({r['run_s'] / full['run_s']:.2f} of the grid; goal <= "
            "0.40), "
            f"best {r['best']} test_acc {r['best_acc']:.4f} ({r['pruned']} pruned), same best: "
            f"{r['best'] == full['best']}"
        )
    assert asha["best"] == full["best"] and three["best"] == full["best"]
