"""`search:` — the sweep format's rules, the study kept in the store, and a search sweep end to end."""

from __future__ import annotations

import json
import math
import sys

import optuna
import pytest

from orchestrator.backends.registry import load_sweep
from orchestrator.control.study import Outcome, Study, first_random_trials
from orchestrator.errors import OrchError
from orchestrator.store.folder import LocalStore
from orchestrator.store.layout import study_key
from orchestrator.sweep.search import SearchSection
from tests.conftest import starts

SPACE = {
    "lr": {"low": 0.0001, "high": 1.0, "log": True},
    "wd": {"low": 0.0, "high": 0.001},
    "depth": {"low": 2, "high": 8, "int": True},
    "opt": {"choices": ["sgd", "adam"]},
}


def objective_of(params: dict) -> float:
    """A synthetic objective with a known optimum (lr=0.01, wd=0.0005, depth=5, opt=adam): 1.0 there."""
    lr_term = (math.log10(params["lr"]) + 2) ** 2 / 4
    wd_term = ((params["wd"] - 0.0005) / 0.001) ** 2
    depth_term = (params["depth"] - 5) ** 2 / 9
    return 1.0 - lr_term - wd_term - depth_term - (0.0 if params["opt"] == "adam" else 0.2)


def optuna_objective(trial: optuna.Trial) -> float:
    params = {
        "lr": trial.suggest_float("lr", 0.0001, 1.0, log=True),
        "wd": trial.suggest_float("wd", 0.0, 0.001),
        "depth": trial.suggest_int("depth", 2, 8),
        "opt": trial.suggest_categorical("opt", ["sgd", "adam"]),
    }
    return objective_of(params)


def section(**over) -> SearchSection:
    return SearchSection.model_validate({"trials": 15, "metric": "score", "space": SPACE, **over})


@pytest.mark.parametrize("sampler", ["tpe", "random"])
def test_one_trial_at_a_time_asks_what_optunas_own_optimize_asks_even_across_restarts(tmp_path, sampler):
    """The study's half of the promise: each ask made by a fresh Study read from the store (as by a controller
    restarted before every trial), told before the next ask, equals study.optimize's sequence. That the controller
    tells before it asks is checked through `orch launch` below."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    search = section(sampler=sampler, seed=3)
    make = optuna.samplers.TPESampler if sampler == "tpe" else optuna.samplers.RandomSampler
    reference = optuna.create_study(direction="maximize", sampler=make(seed=3))
    reference.optimize(optuna_objective, n_trials=search.trials)
    expected = [t.params for t in reference.trials]

    store = LocalStore(str(tmp_path))
    asked = []
    for n in range(search.trials):
        study = Study(store, "sw", search, "max", parallel=1)  # read from the store each time
        params = study.params_for(n)
        asked.append(params)
        study.tell(n, Outcome.COMPLETE, value=objective_of(params))
    assert asked == expected
    assert len({json.dumps(p, sort_keys=True) for p in asked}) == search.trials  # 15 distinct trials


def test_an_asked_trial_is_never_asked_again_and_none_is_lost(tmp_path):
    store = LocalStore(str(tmp_path))
    search = section(trials=5)
    first = Study(store, "sw", search, "max", parallel=2)
    p0, p1 = first.params_for(0), first.params_for(1)  # two running, nothing told
    again = Study(store, "sw", search, "max", parallel=2)  # the controller restarted
    assert again.params_for(0) == p0 and again.params_for(1) == p1
    assert len(again.record.trials) == 2
    p3 = again.params_for(3)  # asks 2, then 3, in order
    assert [t.number for t in again.record.trials] == [0, 1, 2, 3]
    assert Study(store, "sw", search, "max", parallel=2).params_for(3) == p3


def test_told_outcomes_are_kept_in_the_store(tmp_path):
    store = LocalStore(str(tmp_path))
    search = section(trials=3)
    s = Study(store, "sw", search, "max", parallel=1)
    for n in range(3):
        s.params_for(n)
    s.tell(0, Outcome.COMPLETE, value=0.5)
    s.tell(1, Outcome.PRUNED, intermediate={"2.0": 0.1})
    s.tell(2, Outcome.FAIL)
    back = Study(store, "sw", search, "max", parallel=1).record.trials
    assert [(t.outcome, t.value, t.intermediate) for t in back] == [
        (Outcome.COMPLETE, 0.5, {}),
        (Outcome.PRUNED, None, {"2.0": 0.1}),
        (Outcome.FAIL, None, {}),
    ]


@pytest.mark.parametrize(
    "change, words",
    [
        (lambda d: d.update(trials="x"), "no list"),
        (lambda d: d["trials"][0]["params"].update(lr=5.0), "outside the space"),
        (lambda d: d["trials"][0]["params"].update(opt="$(touch /tmp/x)"), "outside the space"),
        (lambda d: d["trials"][0].update(outcome="great"), "unknown outcome"),
        (lambda d: d["trials"][0].update(outcome="complete", value=float("nan")), "without a finite value"),
        (lambda d: d.update(seed=99), "seed"),
        (lambda d: d["rng"][0][1].append(7), "random state"),
    ],
)
def test_a_study_record_changed_by_someone_else_is_refused_with_the_fix(tmp_path, change, words):
    store = LocalStore(str(tmp_path))
    search = section(trials=3)
    Study(store, "sw", search, "max", parallel=1).params_for(0)
    path = tmp_path / study_key("sw")
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))
    with pytest.raises(OrchError) as err:
        Study(store, "sw", search, "max", parallel=1)
    assert words in str(err.value) and "study record" in str(err.value)


def test_the_same_seed_gives_the_same_random_trials_and_another_seed_others():
    a = first_random_trials(section(sampler="random", seed=1), 4)
    assert a == first_random_trials(section(sampler="random", seed=1), 4)
    assert a != first_random_trials(section(sampler="random", seed=2), 4)
    for p in a:
        assert 0.0001 <= p["lr"] <= 1.0 and 2 <= p["depth"] <= 8 and isinstance(p["depth"], int)


# --- the sweep format ------------------------------------------------------------------------------

BASE = """\
name: s
command: "echo {lr}"
search:
  trials: 4
  metric: score
  mode: max
  space:
    lr: {low: 0.001, high: 1.0, log: true}
"""


@pytest.mark.parametrize(
    "text, words",
    [
        ("name: s\ncommand: x\nsearch:\n  trials: 4\n  metric: m\n  space: {}\n", "empty space"),
        (BASE.replace("low: 0.001, high: 1.0", "low: 1.0, high: 1.0"), "must be below high"),
        (BASE.replace("low: 0.001", "low: 0.0"), "`log: true` needs low > 0"),
        (BASE.replace("log: true", "int: true"), "`int: true` needs whole bounds"),
        (BASE.replace("{low: 0.001, high: 1.0, log: true}", "{choices: []}"), "empty `choices:`"),
        (BASE.replace("{low: 0.001, high: 1.0, log: true}", "{choices: [a, a]}"), "repeats a value"),
        (BASE.replace("trials: 4", "trials: 0"), "greater than or equal to 1"),
        (BASE + "max_runs: 3\n", "over `max_runs: 3`"),
        (BASE.replace("  trials: 4", "  sampler: grid\n  trials: 4"), "'tpe' or 'random'"),
        (BASE + "params:\n  lr: 0.1\n", "also in params"),
        (BASE + "grid:\n  wd: [0, 1]\n", "`grid:` and `search:` together"),
        (BASE.replace("  metric: score\n  mode: max\n", ""), "which metric the sampler optimizes"),
        (BASE.replace("  mode: max\n", ""), "say `mode: max` or `mode: min`: 'score' ends neither in acc nor in loss"),
        (
            BASE + "prune: {metric: score, mode: min, rungs: [1, 2]}\n",
            "max contradicts prune's min for the same metric 'score'",
        ),
        (
            BASE.replace("metric: score", "metric: test_loss") + "prune: {metric: test_loss, rungs: [1, 2]}\n",
            "max contradicts prune's min for the same metric 'test_loss'",
        ),
        (
            BASE.replace("  metric: score\n", "") + "target: {metric: score, value: 0.9, mode: min}\n",
            "max contradicts target's min for the same metric 'score'",
        ),
        (BASE.replace("{low: 0.001, high: 1.0, log: true}", "{low: 0.1}"), "needs `low:` and `high:`"),
        (BASE.replace("{low: 0.001, high: 1.0, log: true}", "{low: 0.1, high: 1, choices: [1]}"), "not both"),
        (BASE.replace('"echo {lr}"', '"echo {lr} {mom}"'), "placeholder {mom} has no param"),
        (BASE + "    $(touch x): {low: 1, high: 2}\n", "not a valid name"),
        (BASE + "    seed: {low: 1, high: 9, int: true}\n", "'seed' is reserved by orch; use the `seeds:` field"),
        (BASE + "    run_id: {choices: [a, b]}\n", "'run_id' is reserved by orch; rename it"),
        (BASE + "    python: {choices: [a, b]}\n", "'python' is reserved by orch; rename it"),
        (BASE + "    sweep: {choices: [a, b]}\n", "'sweep' is reserved by orch; rename it"),
        (BASE + "    torchrun: {choices: [a, b]}\n", "'torchrun' is reserved by orch; rename it"),
    ],
)
def test_a_bad_search_is_refused_with_file_line_and_the_fix(tmp_path, text, words):
    from orchestrator.errors import SpecError

    path = tmp_path / "sweep.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as err:
        load_sweep(path)
    assert words in str(err.value)
    assert str(path) + ":" in str(err.value)


@pytest.mark.parametrize(
    "change, words",
    [
        (("seed: 0", "seed: -1"), "must be between 0 and 4294967295 (numpy's seed range)"),
        (("seed: 0", "seed: 4294967296"), "must be between 0 and 4294967295 (numpy's seed range)"),
        (("{low: 0.001, high: 1.0, log: true}", "{low: -1e308, high: 1e308}"), "wider than a float holds"),
        (("{low: 0.001, high: 1.0, log: true}", "{low: -1e300, high: 1e300, int: true}"), "within ±9007199254740992"),
    ],
)
@pytest.mark.parametrize("dry", [True, False])
def test_values_the_sampler_cannot_take_are_refused_by_launch_before_anything_is_recorded(orch, change, words, dry):
    """Each of these once passed validation and crashed the sampler after the sweep was recorded (or the dry run)."""
    text = BASE.replace("  trials: 4\n", "  sampler: random\n  seed: 0\n  trials: 4\n") + "store: store\n"
    path = orch.sweep(text.replace(*change))
    r = orch("launch", str(path), *(["--dry-run"] if dry else []))
    assert r.code == 2, r.out + r.err
    assert words in r.err and f"{path}:" in r.err and "Traceback" not in r.out + r.err
    assert not orch.store().exists()  # nothing recorded, nothing launched


@pytest.mark.parametrize(
    "text, words",
    [
        (
            BASE.replace("log: true}", "log: true, chioces: [1]}"),
            "did you mean `choices`? Allowed here: low, high, log",
        ),
        (BASE.replace("log: true}", "log: true, stpe: 2}"), "allowed here: low, high, log, int, choices."),
        (BASE.replace("{low: 0.001, high: 1.0, log: true}", "{choices: [null, 1]}"), "(null is not a value)"),
    ],
)
def test_a_mistake_inside_a_space_entry_is_named_with_the_fix_of_that_entry(tmp_path, text, words):
    from orchestrator.errors import SpecError

    path = tmp_path / "sweep.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as err:
        load_sweep(path)
    message = str(err.value)
    assert words in message and f"{path}:" in message
    assert "`store`" not in message and "write true or false" not in message and "function-after" not in message


def test_a_search_has_one_run_per_trial_and_seed(tmp_path):
    path = tmp_path / "sweep.yaml"
    path.write_text(BASE + "seeds: 2\n")
    sweep = load_sweep(path)
    assert [r.run_id for r in sweep.runs][:3] == ["trial=0,seed=0", "trial=0,seed=1", "trial=1,seed=0"]
    assert len(sweep.runs) == 8
    path.write_text(BASE)
    assert [r.run_id for r in load_sweep(path).runs] == ["trial=0", "trial=1", "trial=2", "trial=3"]


# --- end to end, locally -------------------------------------------------------------------------

SCRIPT = """\
import json, math, os, sys
p = json.loads(os.environ["ORCH_PARAMS_JSON"])
score = 1.0 - (math.log10(p["lr"]) + 2) ** 2 / 4 - (p["depth"] - 5) ** 2 / 9
with open(os.path.join(os.environ["ORCH_RUN_DIR"], "metrics.jsonl"), "a") as f:
    f.write(json.dumps({"epoch": 1, "score": score - 0.5}) + "\\n")
    f.write(json.dumps({"epoch": 2, "score": score}) + "\\n")
"""


@pytest.mark.slow
def test_a_search_sweep_runs_every_trial_and_collect_names_the_best(orch, tmp_path):
    script = tmp_path / "objective.py"
    script.write_text(SCRIPT)
    path = orch.sweep(f"""
        name: tpe-local
        command: "{sys.executable} {script} {{lr}} {{depth}}"
        store: store
        max_parallel: 2
        search:
          sampler: tpe
          trials: 6
          seed: 0
          metric: score
          mode: max
          space:
            lr: {{low: 0.0001, high: 1.0, log: true}}
            depth: {{low: 2, high: 8, int: true}}
    """)
    dry = orch("launch", str(path), "--dry-run")
    assert dry.code == 0, dry.out
    assert "search: tpe, 6 trials" in dry.out and "lr: 0.0001 .. 1 (log)" in dry.out
    r = orch("launch", str(path))
    assert r.code == 0, r.out
    study = json.loads(orch.store(study_key("tpe-local")).read_text())
    assert [t["number"] for t in study["trials"]] == list(range(6))
    assert all(t["outcome"] == "complete" for t in study["trials"])
    c = orch("collect", "tpe-local", "--out", str(tmp_path / "out"))
    assert c.code == 0, c.out
    best = max(study["trials"], key=lambda t: t["value"])
    assert f"best trial: trial={best['number']}" in c.out
    rows = json.loads((tmp_path / "out" / "runs.json").read_text())
    values = [row["trial_value"] for row in rows["runs"]]
    assert values == sorted(values, reverse=True)  # sorted by the trial's value, best first
    assert rows["runs"][0]["lr"] == best["params"]["lr"] and rows["runs"][0]["depth"] == best["params"]["depth"]
    assert rows["best_trial"]["run_id"] == f"trial={best['number']}" and rows["best_trial"]["value"] == best["value"]
    # TensorBoard's HParams view shows each trial with the params it was given
    from tests.unit.control.test_board import session_hparams

    tb = orch("collect", "tpe-local", "--out", str(tmp_path / "out2"), "--tensorboard", str(tmp_path / "tb"))
    assert tb.code == 0, tb.err
    for t in study["trials"]:
        hp = session_hparams(tmp_path / "tb" / f"trial={t['number']}")
        assert hp["lr"] == pytest.approx(t["params"]["lr"]) and hp["depth"] == t["params"]["depth"]
    s = orch("status", "tpe-local")
    assert "search (tpe): 6 of 6 trials asked, 6 told; best so far" in s.out, s.out
    # the study is the sweep's: a relaunch that changes its seed (or space, or sampler) is refused
    path.write_text(path.read_text().replace("seed: 0", "seed: 1"))
    again = orch("launch", str(path))
    assert again.code == 2 and "changed: search" in again.out + again.err


OBJECTIVE = """\
import json, math, os
p = json.loads(os.environ["ORCH_PARAMS_JSON"])
opt_term = 0.0 if p["opt"] == "adam" else 0.2
score = 1.0 - (math.log10(p["lr"]) + 2) ** 2 / 4 - (p["depth"] - 5) ** 2 / 9 - opt_term
with open(os.path.join(os.environ["ORCH_RUN_DIR"], "metrics.jsonl"), "a") as f:
    f.write(json.dumps({"epoch": 1, "score": score}) + "\\n")
"""


@pytest.mark.slow
def test_orch_launch_with_one_trial_at_a_time_asks_what_optunas_own_optimize_asks(orch, tmp_path):
    """README: with `max_parallel: 1` the params asked are exactly those of `study.optimize` with the same sampler
    and seed. Through `orch launch`: each trial's outcome must be told before the next trial is asked (past TPE's
    10 random start-up trials every ask depends on every earlier value)."""
    script = tmp_path / "objective.py"
    script.write_text(OBJECTIVE)
    path = orch.sweep(f"""
        name: optimize
        command: "{sys.executable} {script}"
        store: store
        max_parallel: 1
        search:
          sampler: tpe
          seed: 11
          trials: 13
          metric: score
          mode: max
          space:
            lr: {{low: 0.0001, high: 1.0, log: true}}
            depth: {{low: 2, high: 8, int: true}}
            opt: {{choices: [sgd, adam]}}
    """)
    r = orch("launch", str(path))
    assert r.code == 0, r.out + r.err

    def objective(trial: optuna.Trial) -> float:
        p = {
            "lr": trial.suggest_float("lr", 0.0001, 1.0, log=True),
            "depth": trial.suggest_int("depth", 2, 8),
            "opt": trial.suggest_categorical("opt", ["sgd", "adam"]),
        }
        opt_term = 0.0 if p["opt"] == "adam" else 0.2
        return 1.0 - (math.log10(p["lr"]) + 2) ** 2 / 4 - (p["depth"] - 5) ** 2 / 9 - opt_term

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    reference = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=11))
    reference.optimize(objective, n_trials=13)
    trials = json.loads(orch.store(study_key("optimize")).read_text())["trials"]
    assert [t["params"] for t in trials] == [t.params for t in reference.trials]  # trial by trial
    assert [t["value"] for t in trials] == [t.value for t in reference.trials]


@pytest.mark.slow
def test_a_controller_killed_mid_search_is_continued_by_the_next_launch_with_no_trial_asked_twice(orch, job):
    from orchestrator.wait import retry_until

    path = orch.sweep(f"""
        name: killed
        command: "{job(steps=3, release=True)}"
        store: store
        max_parallel: 2
        search:
          sampler: tpe
          trials: 4
          metric: acc
          space:
            lr: {{low: 0.001, high: 1.0, log: true}}
    """)
    first = orch.popen("launch", str(path))
    try:
        retry_until(lambda: len(starts(job.marks)) >= 2, 120, 0.2, "two trials to start")
        before = json.loads(orch.store(study_key("killed")).read_text())["trials"]
    finally:
        first.kill()  # SIGKILL: the controller gets no chance to tidy up
        first.wait()
    assert [t["number"] for t in before] == [0, 1] and all(t["outcome"] == "asked" for t in before)
    job.release.write_text("")
    again = orch("launch", str(path))
    assert again.code == 0, again.out + again.err
    trials = json.loads(orch.store(study_key("killed")).read_text())["trials"]
    assert [t["number"] for t in trials] == [0, 1, 2, 3]
    assert [t["params"] for t in trials[:2]] == [t["params"] for t in before]  # asked once, kept
    assert all(t["outcome"] == "complete" for t in trials)
    started = [line.split(" ", 2) for line in (job.marks / "starts.log").read_text().splitlines()]
    assert sorted(run for run, _, _ in started) == ["trial=0", "trial=1", "trial=2", "trial=3"]  # each once
    for run, _, params in started:
        n = int(run.split("=")[1])
        assert json.loads(params)["lr"] == trials[n]["params"]["lr"]
    assert not (job.marks / "DUPLICATE").exists()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_study_record_corrupted_while_the_controller_runs_is_called_corrupt_with_its_file_and_fix(orch, job):
    """It was reported as "changed by someone else (another controller of this sweep?)"."""
    from orchestrator.wait import retry_until

    path = orch.sweep(f"""
        name: spoiled
        command: "{job(steps=2, release=True)}"
        store: store
        max_parallel: 1
        search:
          trials: 2
          metric: acc
          space:
            lr: {{low: 0.001, high: 1.0, log: true}}
    """)
    launch = orch.popen("launch", str(path))
    record = orch.store(study_key("spoiled"))
    try:
        retry_until(lambda: len(starts(job.marks)) >= 1, 120, 0.2, "the first trial to start")
        record.write_text('{"version": 1, "trials": [')  # a half-written file: no JSON
        job.release.write_text("")
        out = launch.communicate(timeout=300)[0]  # (stderr goes to stdout)
    finally:
        launch.kill()
        launch.wait()
    assert launch.returncode == 2, out
    assert f"the study record {study_key('spoiled')} is corrupt (not JSON)" in out, out
    assert "restore it from a backup, or relaunch the sweep under a new `name:`" in out, out
    assert "someone else" not in out and "Traceback" not in out, out


def _views(**states) -> dict:
    from orchestrator.control.views import RunView

    return {
        rid.replace("_", "="): RunView(
            run_id=rid.replace("_", "="),
            state=s,
            attempt=1,
            failures=0,
            preemptions=0,
            elapsed=1.0,
            metrics={},
            final=s in ("succeeded", "failed", "pruned", "cancelled"),
        )
        for rid, s in states.items()
    }


def test_a_trial_is_told_the_mean_of_its_seeds_once_all_ended_pruned_with_its_rungs_failed_as_fail(tmp_path):
    from orchestrator.control.trials import Trials
    from orchestrator.store.layout import metrics_key

    text = BASE.replace("trials: 4", "trials: 3") + "seeds: 2\n"
    (tmp_path / "sweep.yaml").write_text(text)
    sweep = load_sweep(tmp_path / "sweep.yaml")
    store = LocalStore(str(tmp_path / "store"))
    for rid, score in (("trial=0,seed=0", 0.5), ("trial=0,seed=1", 0.7)):
        lines = [{"epoch": 1, "score": 0.1}, {"epoch": 2, "score": score}, {"epoch": 3, "loss": 1.0}]
        store.put_bytes(metrics_key("s", rid), "".join(json.dumps(x) + "\n" for x in lines).encode())
    trials = Trials(sweep, store)
    for run in sweep.runs:
        trials.bound(run)
    views = _views(
        **{
            "trial_0,seed_0": "succeeded",
            "trial_0,seed_1": "running",
            "trial_1,seed_0": "pruned",
            "trial_1,seed_1": "succeeded",
            "trial_2,seed_0": "failed",
            "trial_2,seed_1": "succeeded",
        }
    )
    rungs = {"2.0": {"trial=1,seed=0": 0.05}}
    trials.tell_finished(views, rungs)
    record = trials.study.record.trials
    assert record[0].outcome is Outcome.ASKED  # one of its seeds still runs: not told yet
    assert record[1].outcome is Outcome.PRUNED and record[1].intermediate == {"2.0": 0.05}
    assert record[2].outcome is Outcome.FAIL
    views["trial=0,seed=1"].state, views["trial=0,seed=1"].final = "succeeded", True
    trials.tell_finished(views, rungs)
    assert record[0].outcome is Outcome.COMPLETE and record[0].value == pytest.approx(0.6)  # the last line with it
    again = Trials(sweep, store).study.record.trials
    assert [t.outcome for t in again] == [Outcome.COMPLETE, Outcome.PRUNED, Outcome.FAIL]


def test_value_best_takes_the_best_line_and_a_run_without_the_metric_fails_its_trial():
    from orchestrator.control.trials import trial_value

    lines = [{"score": 0.2}, {"score": 0.9}, {"score": 0.4}, {"loss": 1}]
    assert trial_value(lines, "score", "max", "last") == 0.4
    assert trial_value(lines + [{"score": float("inf")}], "score", "max", "best") == 0.9
    assert trial_value(lines, "score", "min", "best") == 0.2
    assert trial_value([{"loss": 1}], "score", "max", "last") is None


DIVERGES = """\
import json, os
nan = float("nan")
values = {"trial=0": [0.9, nan], "trial=1": [0.5, 0.6]}[os.environ["ORCH_RUN_ID"]]
with open(os.path.join(os.environ["ORCH_RUN_DIR"], "metrics.jsonl"), "a") as f:
    for epoch, score in enumerate(values):
        f.write(json.dumps({"epoch": epoch, "score": score}) + "\\n")
    f.write(json.dumps({"epoch": 9, "other": 1}) + "\\n")
"""


@pytest.mark.slow
def test_a_trial_whose_last_value_is_nan_is_told_fail_and_is_never_the_best(orch, tmp_path):
    """README: `value: last` is the metric on the run's last line that has it; a run without a finite value there
    (it diverged) is told FAIL, whatever it reported before."""
    script = tmp_path / "diverges.py"
    script.write_text(DIVERGES)
    path = orch.sweep(f"""
        name: diverges
        command: "{sys.executable} {script}"
        store: store
        max_parallel: 1
        search: {{sampler: random, trials: 2, metric: score, mode: max, space: {{lr: {{low: 0.1, high: 1.0}}}}}}
    """)
    r = orch("launch", str(path))
    assert r.code == 0, r.out + r.err
    trials = json.loads(orch.store(study_key("diverges")).read_text())["trials"]
    assert [(t["outcome"], t["value"]) for t in trials] == [("fail", None), ("complete", 0.6)]
    c = orch("collect", "diverges", "--out", str(tmp_path / "out"))
    assert c.code == 0, c.out + c.err
    assert "best trial: trial=1" in c.out
    assert json.loads((tmp_path / "out" / "runs.json").read_text())["best_trial"]["run_id"] == "trial=1"


@pytest.mark.slow
def test_a_relaunch_may_raise_trials_to_extend_the_study_and_nothing_else_of_search_may_change(orch, tmp_path):
    """README: raising `trials` continues the study where it stopped (the trials asked keep their params); a change
    of space, sampler, seed, metric, mode or value, or fewer trials, is refused like any change of the runs."""
    script = tmp_path / "objective.py"
    script.write_text(SCRIPT)
    text = f"""
        name: extend
        command: "{sys.executable} {script}"
        store: store
        max_parallel: 1
        search:
          sampler: tpe
          trials: 2
          seed: 0
          metric: score
          mode: max
          space:
            lr: {{low: 0.0001, high: 1.0, log: true}}
            depth: {{low: 2, high: 8, int: true}}
    """
    path = orch.sweep(text)
    assert orch("launch", str(path)).code == 0
    before = json.loads(orch.store(study_key("extend")).read_text())["trials"]
    orch.sweep(text.replace("trials: 2", "trials: 3"))
    r = orch("launch", str(path))
    assert r.code == 0, r.out + r.err
    after = json.loads(orch.store(study_key("extend")).read_text())["trials"]
    assert after[:2] == before and len(after) == 3 and after[2]["outcome"] == "complete"
    s = orch("status", "extend")
    assert "3 succeeded" in s.out and "3 of 3 trials asked, 3 told" in s.out, s.out
    for old, new in [
        ("trials: 3", "trials: 2"),
        ("seed: 0", "seed: 1"),
        ("sampler: tpe", "sampler: random"),
        ("metric: score", "metric: score2"),
        ("mode: max", "mode: min"),
        ("mode: max", "mode: max\n          value: best"),
        ("high: 8", "high: 9"),
    ]:
        orch.sweep(text.replace("trials: 2", "trials: 3").replace(old, new))
        again = orch("launch", str(path))
        assert again.code == 2 and "changed: " in again.err and "search" in again.err, (old, new, again.err)


@pytest.mark.slow
def test_orch_launch_with_two_trials_at_a_time_asks_what_optunas_ask_and_tell_asks_lying_about_running_ones(
    orch, tmp_path
):
    """README (Search): TPE with several running trials uses Optuna's `constant_liar`, so free slots are not all
    sent to one region. Through `orch launch` with `max_parallel: 2`: replayed in the order the controller asked
    and told (fixed by the command: see below), Optuna's own ask-and-tell with `TPESampler(constant_liar=True)`
    asks every trial orch asked (past TPE's 10 random start-up trials each ask sees a trial still running)."""
    script = tmp_path / "objective.py"
    marks = tmp_path / "marks"
    marks.mkdir()
    # each trial ends only once the next one has started: every ask after the first pair is made while one
    # trial runs (what constant_liar is about), whatever the machine's speed
    script.write_text(
        OBJECTIVE
        + "import pathlib, sys, time\n"
        + "marks, n = pathlib.Path(sys.argv[1]), int(os.environ['ORCH_RUN_ID'].split('=')[1])\n"
        + "(marks / f'started.{n}').touch()\n"
        + "while n < 14 and not (marks / f'started.{n + 1}').exists():\n"
        + "    time.sleep(0.05)\n"
    )
    path = orch.sweep(f"""
        name: liar
        command: "{sys.executable} {script} {marks}"
        store: store
        max_parallel: 2
        search:
          sampler: tpe
          seed: 5
          trials: 15
          metric: score
          mode: max
          space:
            lr: {{low: 0.0001, high: 1.0, log: true}}
            depth: {{low: 2, high: 8, int: true}}
            opt: {{choices: [sgd, adam]}}
    """)
    r = orch("launch", str(path))
    assert r.code == 0, r.out + r.err
    trials = json.loads(orch.store(study_key("liar")).read_text())["trials"]
    assert len(trials) == 15 and all(t["outcome"] == "complete" for t in trials), trials
    # the chain fixes the order: trials 0 and 1 asked at once, then each pass tells trial k and asks trial k + 2
    events = [("asked", 0), ("asked", 1)]
    events += [e for k in range(13) for e in (("told", k), ("asked", k + 2))] + [("told", 13), ("told", 14)]

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    reference = optuna.create_study(
        direction="maximize", sampler=optuna.samplers.TPESampler(seed=5, constant_liar=True)
    )
    space = {
        "lr": optuna.distributions.FloatDistribution(0.0001, 1.0, log=True),
        "depth": optuna.distributions.IntDistribution(2, 8),
        "opt": optuna.distributions.CategoricalDistribution(["sgd", "adam"]),
    }
    asked = {}
    for what, number in events:
        if what == "asked":
            asked[number] = reference.ask(space)
            assert asked[number].params == trials[number]["params"], (number, trials[number], asked[number].params)
        else:
            reference.tell(asked[number], trials[number]["value"])
