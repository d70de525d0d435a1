"""A search's study: Optuna's ask-and-tell, with every trial kept in the store (docs/guides/search.md).

orch is the worker pool, the recovery layer and the record; Optuna's samplers (TPESampler,
RandomSampler) only propose. The study lives in the store as one record, `<sweep>/study.json`,
written by the controller alone (conditionally): every trial's params as they were asked, every
value told, and the samplers' random state after the last ask. Nothing else is kept in memory
across asks: each ask rebuilds an in-memory Optuna study from the record (the trials replayed as
enqueued, fixed trials, their outcomes told again), restores the random state, and asks once. So a
controller killed at any moment and started again, here or on another machine, continues the same
study: no trial asked twice, none lost, and with one trial at a time the sequence of params is the
one `study.optimize` asks in a single process.

The record is data from elsewhere (an instance role may write the sweep's prefix): it is read as
JSON, never unpickled, and every value is checked against the sweep's space before it reaches a
command.
"""

from __future__ import annotations

import enum
import json
import logging
from dataclasses import asdict, dataclass, field
from typing import Any

from orchestrator.contract import finite
from orchestrator.errors import OrchError
from orchestrator.store.base import Store, json_bytes
from orchestrator.store.layout import study_key
from orchestrator.sweep.search import Dimension, SearchSection

log = logging.getLogger("orch.study")

RECORD_VERSION = 1


class Outcome(str, enum.Enum):
    """What the sampler was told of a trial."""

    ASKED = "asked"  # params chosen; running, or about to (Optuna: RUNNING)
    COMPLETE = "complete"  # succeeded: its value told
    FAIL = "fail"  # failed for good, or ended without the metric
    PRUNED = "pruned"  # stopped by `prune:`, its values at the rungs told


@dataclass
class Trial:
    number: int
    params: dict[str, Any]
    outcome: Outcome = Outcome.ASKED
    value: float | None = None  # COMPLETE: the value told
    intermediate: dict[str, float] = field(default_factory=dict)  # PRUNED: rung (as text) -> value there


@dataclass
class StudyRecord:
    sampler: str
    seed: int
    trials: list[Trial] = field(default_factory=list)
    rng: list[Any] = field(default_factory=list)  # each sampler RNG's state after the last ask (numpy MT19937)

    def to_json(self) -> dict:
        data = asdict(self)
        for t in data["trials"]:
            t["outcome"] = t["outcome"].value
        return {"version": RECORD_VERSION, **data}


def _bad(key: str, why: str) -> OrchError:
    return OrchError(
        f"the study record {key} is corrupt ({why}). It holds the search's trials: restore it from a backup, "
        "or relaunch the sweep under a new `name:`.",
        exit_code=2,
    )


def parse_record(data: bytes, key: str, search: SearchSection) -> StudyRecord:
    """The record as read from the store, every field checked (params against the sweep's space)."""
    try:
        doc = json.loads(data)
    except ValueError:
        raise _bad(key, "not JSON") from None
    if not isinstance(doc, dict) or doc.get("version") != RECORD_VERSION:
        raise _bad(key, f"not a version-{RECORD_VERSION} study record")
    if doc.get("sampler") != search.sampler or doc.get("seed") != search.seed:
        raise _bad(
            key,
            f"sampler {doc.get('sampler')!r} seed {doc.get('seed')!r}, the sweep says "
            f"{search.sampler!r} seed {search.seed}",
        )
    trials = doc.get("trials")
    if not isinstance(trials, list) or len(trials) > search.trials:
        raise _bad(key, "no list of at most `trials` trials")
    out = StudyRecord(sampler=search.sampler, seed=search.seed, rng=_rng_states(doc.get("rng"), key))
    for number, t in enumerate(trials):
        out.trials.append(_trial(t, number, key, search.space))
    return out


def _trial(t: Any, number: int, key: str, space: dict[str, Dimension]) -> Trial:
    if not isinstance(t, dict) or t.get("number") != number:
        raise _bad(key, f"trial {number} is missing or out of order")
    params = t.get("params")
    if not isinstance(params, dict) or set(params) != set(space):
        raise _bad(key, f"trial {number}'s params are not the space's ({', '.join(space)})")
    for name, value in params.items():
        if not space[name].contains(value):
            raise _bad(key, f"trial {number}: {name}={value!r} is outside the space")
    try:
        outcome = Outcome(t.get("outcome"))
    except ValueError:
        raise _bad(key, f"trial {number}: unknown outcome {t.get('outcome')!r}") from None
    value = t.get("value")
    value = finite(value)
    if outcome is Outcome.COMPLETE and value is None:
        raise _bad(key, f"trial {number} is complete without a finite value")
    inter = t.get("intermediate") or {}
    if not isinstance(inter, dict) or any(finite(v) is None or finite(_float(k)) is None for k, v in inter.items()):
        raise _bad(key, f"trial {number}'s intermediate values are not numbers")
    return Trial(number, params, outcome, value, {k: float(v) for k, v in inter.items()})


def _float(text: Any) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def _rng_states(raw: Any, key: str) -> list[Any]:
    if raw in (None, []):
        return []
    ok = isinstance(raw, list) and all(
        isinstance(s, list)
        and len(s) == 5
        and s[0] == "MT19937"
        and isinstance(s[1], list)
        and len(s[1]) == 624
        and all(isinstance(x, int) and 0 <= x < 2**32 for x in s[1])
        and isinstance(s[2], int)
        and isinstance(s[3], int)
        and isinstance(s[4], (int, float))
        for s in raw
    )
    if not ok:
        raise _bad(key, "the samplers' random state is malformed")
    return raw


# --- Optuna: rebuild, ask ------------------------------------------------------------------------


def _optuna():
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def distributions(space: dict[str, Dimension]) -> dict:
    optuna = _optuna()
    d = optuna.distributions
    out = {}
    for name, dim in space.items():
        if dim.choices is not None:
            out[name] = d.CategoricalDistribution(list(dim.choices))
        elif dim.int_:
            low, high = dim.bounds()
            out[name] = d.IntDistribution(int(low), int(high), log=dim.log)
        else:
            low, high = dim.bounds()
            out[name] = d.FloatDistribution(low, high, log=dim.log)
    return out


def make_sampler(search: SearchSection, parallel: int):
    """Optuna's sampler for the section. TPE with several trials at once lies about the running ones
    (constant_liar), Optuna's way of not proposing the same region to every free slot."""
    samplers = _optuna().samplers
    if search.sampler == "random":
        return samplers.RandomSampler(seed=search.seed)
    return samplers.TPESampler(seed=search.seed, constant_liar=parallel > 1)


def _generators(sampler) -> list:
    """The sampler's numpy generators, in a fixed order (TPE keeps a RandomSampler for its first trials)."""
    out = [sampler._rng.rng]
    inner = getattr(sampler, "_random_sampler", None)
    if inner is not None:
        out.append(inner._rng.rng)
    return out


def _get_states(sampler) -> list[Any]:
    states = []
    for g in _generators(sampler):
        name, keys, pos, has_gauss, cached = g.get_state()
        states.append([str(name), [int(k) for k in keys], int(pos), int(has_gauss), float(cached)])
    return states


def _set_states(sampler, states: list[Any]) -> None:
    import numpy as np

    gens = _generators(sampler)
    if len(states) != len(gens):
        raise OrchError("the study record's random state is for another sampler; relaunch under a new `name:`")
    for g, (name, keys, pos, has_gauss, cached) in zip(gens, states):
        g.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))


def rebuild(record: StudyRecord, search: SearchSection, mode: str, parallel: int):
    """An in-memory Optuna study holding the record's trials, its sampler at the recorded random state."""
    optuna = _optuna()
    sampler = make_sampler(search, parallel)
    study = optuna.create_study(direction="maximize" if mode == "max" else "minimize", sampler=sampler)
    dists = distributions(search.space)
    for t in record.trials:
        study.enqueue_trial(t.params)
        trial = study.ask(dists)
        if t.outcome is Outcome.COMPLETE:
            study.tell(trial, t.value)
        elif t.outcome is Outcome.FAIL:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
        elif t.outcome is Outcome.PRUNED:
            for step, value in sorted(t.intermediate.items(), key=lambda kv: float(kv[0])):
                trial.report(value, step=int(round(float(step) * 1000)))
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
    if record.rng:
        _set_states(sampler, record.rng)
    return study, sampler


def ask_next(record: StudyRecord, search: SearchSection, mode: str, parallel: int) -> Trial:
    """Ask the sampler for the next trial; the record gains it and the random state after it."""
    study, sampler = rebuild(record, search, mode, parallel)
    asked = study.ask(distributions(search.space))
    trial = Trial(number=len(record.trials), params={k: _plain(asked.params[k]) for k in search.space})
    record.trials.append(trial)
    record.rng = _get_states(sampler)
    return trial


def _plain(v: Any) -> Any:
    """numpy scalars from a sampler -> JSON's types."""
    return v.item() if hasattr(v, "item") else v


# --- the study in the store ----------------------------------------------------------------------


class Study:
    """The sweep's study as the controller uses it: params for a trial (asked on first need), outcomes told."""

    def __init__(self, store: Store, sweep: str, search: SearchSection, mode: str, parallel: int):
        self.store, self.key, self.search, self.mode, self.parallel = store, study_key(sweep), search, mode, parallel
        data, self.version = store.get_versioned(self.key)
        self.record = (
            parse_record(data, self.key, search)
            if data is not None
            else StudyRecord(sampler=search.sampler, seed=search.seed)
        )

    def params_for(self, number: int) -> dict[str, Any]:
        """Trial `number`'s params: asked now (with every earlier trial first) unless the record has them."""
        while len(self.record.trials) <= number:
            trial = ask_next(self.record, self.search, self.mode, self.parallel)
            self._save(f"asked trial {trial.number}: {trial.params}")
        return dict(self.record.trials[number].params)

    def told(self, number: int) -> bool:
        return number < len(self.record.trials) and self.record.trials[number].outcome is not Outcome.ASKED

    def tell(
        self,
        number: int,
        outcome: Outcome,
        value: float | None = None,
        intermediate: dict[str, float] | None = None,
    ) -> None:
        trial = self.record.trials[number]
        trial.outcome, trial.value, trial.intermediate = outcome, value, dict(intermediate or {})
        self._save(f"told trial {number}: {outcome.value}" + (f" {value:.6g}" if value is not None else ""))

    def _save(self, what: str) -> None:
        new = self.store.put_if(self.key, json_bytes(self.record.to_json()), self.version)
        if new is None:
            data = self.store.get_bytes(self.key)  # a record that cannot be read was not written by a controller
            if data is not None:
                parse_record(data, self.key, self.search)  # raises: corrupt, named with its fix
            raise OrchError(
                f"the study record {self.key} was changed by someone else (another controller of this sweep?). "
                "One controller per sweep: stop the other (`orch down`), then launch again.",
                exit_code=2,
            )
        self.version = new
        log.info("%s", what)


def first_random_trials(search: SearchSection, count: int) -> list[dict[str, Any]]:
    """What a random search asks first (it ignores the outcomes): for `--dry-run`."""
    record = StudyRecord(sampler=search.sampler, seed=search.seed)
    return [ask_next(record, search, "max", 1).params for _ in range(min(count, search.trials))]
