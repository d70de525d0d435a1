"""`search:` — trials proposed by a sampler instead of a grid (docs/guides/search.md).

A search sweep has a fixed set of runs, `trial=N` (and `trial=N,seed=S` with several seeds), known
before anything starts; what a trial's params are is decided only when it is about to start (the
sampler asks with what earlier trials told it). This module is the sweep format's half: the
section's model, its cross-field rules, the trial runs, and binding sampled values into a run's
command. The sampler itself is the controller's (control/study.py).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Literal, Union

from pydantic import Field, StrictBool, StrictInt, StrictStr, model_validator

from orchestrator.contract import default_mode
from orchestrator.errors import OrchError
from orchestrator.sweep.spec_types import KEY_RE, Amount, Count, Strict

Choice = Union[StrictBool, StrictInt, Amount, StrictStr]  # noqa: UP007 (a runtime alias of Annotated types)
TRIAL = "trial"  # the run id's key: trial=N
SEED_MAX = 2**32 - 1  # the samplers seed numpy's RandomState: 0 .. 2**32 - 1
INT_BOUND = 2**53


class Dimension(Strict):
    """One axis of the space: a range (`low`, `high`, `log`, `int`) or a list of `choices`."""

    low: Amount | None = Field(None, description="Lower bound (inclusive).")
    high: Amount | None = Field(None, description="Upper bound (inclusive).")
    log: StrictBool = Field(False, description="Sample on a log scale (low > 0).")
    int_: StrictBool = Field(False, alias="int", description="Whole numbers only (bounds must be whole).")
    choices: list[Choice] | None = Field(None, description="Categorical: one of these values.")

    model_config = {"extra": "forbid", "populate_by_name": True}

    @model_validator(mode="after")
    def _shape(self) -> Dimension:
        ranged = self.low is not None or self.high is not None
        if self.choices is not None and (ranged or self.log or self.int_):
            raise ValueError("give either `choices:` or `low:`/`high:` (with `log:`/`int:`), not both")
        if self.choices is None and (self.low is None or self.high is None):
            raise ValueError("a dimension needs `low:` and `high:` (a range) or `choices:` (a list)")
        return self

    def bounds(self) -> tuple[float, float]:
        """A range's (low, high); `_shape` has made sure both are there when `choices:` is not."""
        if self.low is None or self.high is None:
            raise ValueError("a range needs `low:` and `high:`")
        return self.low, self.high

    def problem(self) -> str:
        """What is wrong with this dimension's values, with the fix ('' when nothing)."""
        if self.choices is not None:
            if not self.choices:
                return "empty `choices:`; give at least two values, or move the value to `params:`"
            if len({json.dumps(c) for c in self.choices}) != len(self.choices):
                return "`choices:` repeats a value; every choice must differ"
            return ""
        low, high = self.bounds()
        if low >= high:
            return f"low ({_num(low)}) must be below high ({_num(high)})"
        if self.log and low <= 0:
            return f"`log: true` needs low > 0 (got {_num(low)}); use a positive lower bound"
        if self.int_ and (low != int(low) or high != int(high)):
            return f"`int: true` needs whole bounds (got {_num(low)} .. {_num(high)})"
        if self.int_ and max(abs(low), abs(high)) > INT_BOUND:
            return f"`int: true` bounds must lie within ±{INT_BOUND} (2**53: whole numbers a float holds exactly)"
        if not self.log and not math.isfinite(float(high) - float(low)):
            # the samplers draw low + (high - low) * u: a width past the largest float overflows there
            return (
                f"the range {_num(low)} .. {_num(high)} is wider than a float holds; narrow it "
                "(e.g. ±1e300), or use `log: true` with a positive low"
            )
        return ""

    def contains(self, value: Any) -> bool:
        """Whether a value (read back from the store) is one this dimension can give."""
        if self.choices is not None:
            return any(json.dumps(value) == json.dumps(c) for c in self.choices)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return False
        if self.int_ and value != int(value):
            return False
        low, high = self.bounds()
        return low <= value <= high


class SearchSection(Strict):
    """Random or Bayesian (TPE) search with Optuna's samplers (docs/guides/search.md)."""

    sampler: Literal["tpe", "random"] = Field("tpe", description="tpe (default) or random.")
    trials: Count = Field(..., ge=1, description="Trials in all.")
    seed: StrictInt = Field(0, description="The sampler's seed: the same seed gives the same random trials.")
    metric: str | None = Field(None, min_length=1, description="What the sampler optimizes (default: target's).")
    mode: Literal["max", "min"] | None = Field(None, description="max or min (default as for target:/prune:).")
    value: Literal["last", "best"] = Field(
        "last", description="last: the metric on the run's last line that has it; best: its best over the run."
    )
    space: dict[str, Dimension] = Field(..., description="The params the sampler chooses, each a Dimension.")


def _num(value: float) -> str:
    return f"{value:g}"


def resolved_metric(spec) -> tuple[str | None, str]:
    """(metric, mode) the sampler optimizes: search's own, else target's, else prune's; mode likewise (a sweep
    whose mode cannot be told was refused at load: see problems)."""
    metric = _metric(spec)
    return metric, _mode(spec, metric) or "max"


@dataclass(frozen=True)
class Objective:
    """What a loaded search sweep optimizes: its section, and the metric and mode resolved (load refuses a search
    whose metric cannot be told: see problems)."""

    search: SearchSection
    metric: str
    mode: str  # max | min


def objective(spec) -> Objective:
    """The objective of a search sweep; an error for a sweep without `search:` or a metric (never loaded)."""
    metric, mode = resolved_metric(spec)
    if spec.search is None or metric is None:
        raise OrchError(f"sweep {spec.name!r} has no search metric: give `search.metric:` (e.g. test_acc)")
    return Objective(spec.search, metric, mode)


def _metric(spec) -> str | None:
    s = spec.search
    return s.metric or (spec.target.metric if spec.target else None) or (spec.prune.metric if spec.prune else None)


def _mode(spec, metric: str | None) -> str | None:
    """The search's mode as the sweep says it (search's, target's or prune's on the same metric, or the metric's
    name); None when nothing says it."""
    if metric is None:
        return None
    mode = spec.search.mode
    if mode is None and spec.target is not None and spec.target.metric == metric:
        mode = spec.target.mode
    if mode is None and _prune_metric(spec) == metric:
        mode = spec.prune.mode
    return mode or default_mode(metric)


def _prune_metric(spec) -> str | None:
    if spec.prune is None:
        return None
    return spec.prune.metric or (spec.target.metric if spec.target else None)


def _mode_problems(spec) -> list[tuple[tuple[Any, ...], str]]:
    """A mode nothing says (orch does not guess, as for target: and prune:), or one that contradicts target's or
    prune's on the same metric (runs would be pruned, or stopped, for what the search calls worse)."""
    metric = _metric(spec)
    if metric is None:
        return []
    mode = _mode(spec, metric)
    if mode is None:
        return [(("search", "mode"), f"say `mode: max` or `mode: min`: '{metric}' ends neither in acc nor in loss")]
    out: list[tuple[tuple[Any, ...], str]] = []
    t = spec.target
    if t is not None and t.metric == metric and t.resolved_mode() != mode:
        out.append(
            (
                ("search", "mode"),
                f"{mode} contradicts target's {t.resolved_mode()} for the same metric '{metric}': remove "
                "`search.mode` (it follows target) or make the two agree",
            )
        )
    if _prune_metric(spec) == metric:
        prune_mode = spec.prune.mode or (t.resolved_mode() if t is not None and t.metric == metric else None)
        prune_mode = prune_mode or default_mode(metric)
        if prune_mode is not None and prune_mode != mode:
            out.append(
                (
                    ("search", "mode"),
                    f"{mode} contradicts prune's {prune_mode} for the same metric '{metric}': trials would be pruned "
                    "for what the search calls better. Make `search.mode` and `prune.mode` agree",
                )
            )
    return out


def problems(spec) -> list[tuple[tuple[Any, ...], str]]:
    """Cross-field rules of `search:` (see checks.py for the format of a problem)."""
    s = spec.search
    out: list[tuple[tuple[Any, ...], str]] = []
    if spec.grid:
        out.append(
            (
                ("grid",),
                "`grid:` and `search:` together: a search chooses its own params; move the grid's "
                "axes into `search.space` (as `choices:`) or drop `search:`",
            )
        )
    if not s.space:
        out.append((("search", "space"), "empty space: give at least one param, e.g. `lr: {low: 0.001, high: 1.0}`"))
    for name, dim in s.space.items():
        problem = dim.problem()
        if problem:
            out.append((("search", "space", name), problem))
        if name in spec.params:
            out.append((("search", "space", name), f"'{name}' is also in params; keep it in one of the two"))
        if not KEY_RE.match(name):
            out.append(
                (("search", "space", name), f"not a valid name; use letters, digits and '_' (it becomes {{{name}}})")
            )
        if name == TRIAL:
            out.append((("search", "space", name), "'trial' is reserved by orch (it numbers the trials); rename it"))
    if not 0 <= s.seed <= SEED_MAX:
        out.append((("search", "seed"), f"must be between 0 and {SEED_MAX} (numpy's seed range); got {s.seed}"))
    if s.trials > spec.max_runs:
        out.append(
            (
                ("search", "trials"),
                f"{s.trials} trials is over `max_runs: {spec.max_runs}`; fewer trials, "
                "or raise `max_runs:` if you mean it",
            )
        )
    if resolved_metric(spec)[0] is None:
        out.append(
            (("search", "metric"), "which metric the sampler optimizes: give `metric:` (e.g. test_acc), or a `target:`")
        )
    return out + _mode_problems(spec)


def trial_id(number: int, seed: int | None) -> str:
    return f"{TRIAL}={number}" + (f",seed={seed}" if seed is not None else "")


def trial_of(run_id: str) -> int | None:
    """The trial number a run id names (`trial=3` or `trial=3,seed=1`), or None."""
    head = run_id.split(",", 1)[0]
    key, _, number = head.partition("=")
    return int(number) if key == TRIAL and number.isdigit() else None


def trial_number(run_id: str) -> int:
    """The trial number of a search sweep's run (every run of one is `trial=N`); an error for any other id."""
    number = trial_of(run_id)
    if number is None:
        raise OrchError(f"run {run_id!r} is not a trial of a search (trial=N or trial=N,seed=S)")
    return number


def space_keys(spec) -> list[str]:
    return list(spec.search.space) if spec.search is not None else []
