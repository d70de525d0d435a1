"""Benchmark: `search:` — TPE against random search and a grid of about as many runs, through orch's study.

Every trial is asked and told through orch's own Study (control/study.py) on a folder store, one
trial at a time, exactly as the controller does (a fresh Study read from the store for each ask, as
after a restart). The objective is synthetic with a known optimum of 1.0: four params — lr on a log
scale, wd, an integer depth and a categorical optimizer — plus noise (sd 0.02) on the value told.
Regret is 1.0 minus the best noise-free value among the trials. 40 trials, 5 sampler seeds; the
goal is TPE's median regret <= 0.5 x random's.

With `prune:` on top (ASHA, control/prune.py's Rungs, rungs [1, 2, 4] of 8 epochs, keep 0.34,
min_runs 3), each trial is a learning curve that rises towards its value; an epoch is a run-second.
Reported: run-seconds of the 40 trials and the best value found, with and without pruning.

    scripts/test.sh tests/bench/test_bench_search.py -m bench -s
"""

from __future__ import annotations

import itertools
import math
import random
import statistics
import textwrap

import pytest

from orchestrator.backends.registry import load_sweep
from orchestrator.control.prune import Rungs
from orchestrator.control.study import Outcome, Study
from orchestrator.store.folder import LocalStore

pytestmark = pytest.mark.bench

TRIALS, SEEDS, EPOCHS, NOISE = 40, 5, 8, 0.02
SPEC = """\
name: bench
command: "true"
search:
  sampler: {sampler}
  trials: {trials}
  seed: {seed}
  metric: score
  mode: max
  space:
    lr: {{low: 0.0001, high: 1.0, log: true}}
    wd: {{low: 0.0, high: 0.001}}
    depth: {{low: 2, high: 8, int: true}}
    opt: {{choices: [sgd, adam]}}
"""
PRUNE = """\
prune:
  metric: score
  mode: max
  at: epoch
  rungs: [1, 2, 4]
  keep: 0.34
  min_runs: 3
"""


def truth(p: dict) -> float:
    """1.0 at lr=0.01, wd=0.0005, depth=5, opt=adam."""
    return (
        1.0
        - (math.log10(p["lr"]) + 2) ** 2 / 4
        - ((p["wd"] - 0.0005) / 0.001) ** 2
        - (p["depth"] - 5) ** 2 / 9
        - (0.0 if p["opt"] == "adam" else 0.2)
    )


def load(tmp_path, sampler: str, seed: int, prune: bool = False):
    path = tmp_path / f"{sampler}-{seed}-{prune}.yaml"
    path.write_text(SPEC.format(sampler=sampler, trials=TRIALS, seed=seed) + (PRUNE if prune else ""))
    return load_sweep(path).spec


def search_regret(tmp_path, sampler: str, seed: int) -> float:
    spec = load(tmp_path, sampler, seed)
    store = LocalStore(str(tmp_path / f"store-{sampler}-{seed}"))
    noise = random.Random(seed)
    best = -math.inf
    for n in range(TRIALS):
        study = Study(store, "bench", spec.search, "max", parallel=1)
        p = study.params_for(n)
        best = max(best, truth(p))
        study.tell(n, Outcome.COMPLETE, value=truth(p) + noise.gauss(0, NOISE))
    return 1.0 - best


def grid_regret() -> tuple:
    grid = itertools.product([0.0001, 0.001, 0.01, 0.1, 1.0], [0.00025, 0.00075], [3, 7], ["sgd", "adam"])
    points = [dict(lr=lr, wd=wd, depth=d, opt=o) for lr, wd, d, o in grid]
    return 1.0 - max(truth(p) for p in points), len(points)


def curve(p: dict, epoch: int, noise: random.Random) -> float:
    return truth(p) - 0.5 * math.exp(-epoch / 2) + noise.gauss(0, NOISE)


def pruned_search(tmp_path, seed: int, prune: bool) -> tuple:
    """(run-seconds, best noise-free value among trials that ran to the end)."""
    spec = load(tmp_path, "tpe", seed, prune)
    store = LocalStore(str(tmp_path / f"store-prune-{seed}-{prune}"))
    rungs = Rungs(store, "bench", spec) if prune else None
    noise = random.Random(seed)
    seconds, best = 0, -math.inf
    for n in range(TRIALS):
        study = Study(store, "bench", spec.search, "max", parallel=1)
        p, rid, lines, verdict = study.params_for(n), f"trial={n}", [], None
        for epoch in range(1, EPOCHS + 1):
            seconds += 1
            lines.append({"epoch": epoch, "score": curve(p, epoch, noise)})
            if rungs is not None:
                verdict = rungs.observe(rid, lines, judge=True)
                if verdict is not None and not verdict.kept:
                    break
        if verdict is not None and not verdict.kept:
            inter = {rung: vals[rid] for rung, vals in rungs.values.items() if rid in vals}
            study.tell(n, Outcome.PRUNED, intermediate=inter)
        else:
            best = max(best, truth(p))
            study.tell(n, Outcome.COMPLETE, value=lines[-1]["score"])
    return seconds, best


def test_tpe_finds_better_trials_than_random_search_and_a_grid(tmp_path):
    tpe = [search_regret(tmp_path, "tpe", s) for s in range(SEEDS)]
    rnd = [search_regret(tmp_path, "random", s) for s in range(SEEDS)]
    grid, grid_runs = grid_regret()
    ratio = statistics.median(tpe) / statistics.median(rnd)
    print(
        textwrap.dedent(f"""
        search benchmark: {TRIALS} trials, {SEEDS} sampler seeds, regret = 1 - best noise-free value
          tpe    median regret {statistics.median(tpe):.4f}  (per seed {", ".join(f"{r:.3f}" for r in tpe)})
          random median regret {statistics.median(rnd):.4f}  (per seed {", ".join(f"{r:.3f}" for r in rnd)})
          grid   regret {grid:.4f}  ({grid_runs} runs)
          tpe / random: {ratio:.2f} (goal <= 0.5); tpe / grid: {statistics.median(tpe) / grid:.2f}""")
    )
    assert ratio <= 0.5


def best(results) -> float:
    """The median over seeds of the best noise-free value found."""
    return statistics.median(b for _, b in results)


def test_pruning_on_top_of_tpe_spends_fewer_run_seconds(tmp_path):
    plain = [pruned_search(tmp_path, s, prune=False) for s in range(SEEDS)]
    pruned = [pruned_search(tmp_path, s, prune=True) for s in range(SEEDS)]
    secs = statistics.median(s for s, _ in pruned) / statistics.median(s for s, _ in plain)
    print(
        textwrap.dedent(f"""
        search + prune: {TRIALS} TPE trials of {EPOCHS} epochs (an epoch = a run-second), {SEEDS} seeds
          without prune: median {statistics.median(s for s, _ in plain):.0f} run-seconds, best {best(plain):.4f}
          with prune   : median {statistics.median(s for s, _ in pruned):.0f} run-seconds, best {best(pruned):.4f}
          run-seconds with / without: {secs:.2f}""")
    )
    assert secs < 1.0
