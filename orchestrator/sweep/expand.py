"""A SweepSpec -> the runs it expands to: grid x seeds (or a search's trials), stable readable ids, and each
run's shell command from the `command:` template (only plain {name} placeholders; every value shell-quoted).

Pure, like the rest of sweep/: what the spec says, nothing launched.
"""

from __future__ import annotations

import itertools
import json
import re
import shlex
import string
import sys
from typing import Any

from orchestrator.sweep.search import trial_id
from orchestrator.sweep.spec import AUTO_PYTHON, RunSpec, SweepSpec, host_python
from orchestrator.sweep.spec_types import KEY_RE


def seeds_of(spec: SweepSpec) -> list[int]:
    return list(range(spec.seeds)) if isinstance(spec.seeds, int) else list(spec.seeds)


def placeholders(command: str) -> list[str]:
    """Field names used in a command template; raises ValueError on malformed braces."""
    names = []
    for _, name, spec, conversion in string.Formatter().parse(command):
        if name is None:
            continue
        if name == "" or name.isdigit():
            raise ValueError("positional placeholder '{}' is not allowed: name a param, e.g. {lr}")
        # Only plain {name}: a conversion, format spec, attribute or index would bypass the shell
        # quoting every value gets ({v!r} of "$(touch x)" is unquoted text) or crash at expansion.
        if conversion is not None or spec or not KEY_RE.match(name):
            shown = "{" + name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
            plain = re.split(r"[^A-Za-z0-9_]", name)[0] or "name"
            raise ValueError(
                f"placeholder {shown} is not allowed: only plain {{name}} placeholders are (no !conversion, "
                f":format, .attribute or [index]); write {{{plain}}}"
            )
        names.append(name)
    return names


ID_VALUE_MAX = 48  # longer values are shortened in run ids, with a hash of the whole value so ids stay distinct


def run_count(spec: SweepSpec) -> int:
    """How many runs the spec expands to, computed without expanding it."""
    n = spec.seeds if isinstance(spec.seeds, int) else len(spec.seeds)
    if spec.search is not None:
        return n * spec.search.trials
    for values in spec.grid.values():
        n *= len(values)
    return n


def _id_value(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, bool) else str(value)
    safe = re.sub(r"[^A-Za-z0-9.+-]", "_", text)
    if len(safe) <= ID_VALUE_MAX:
        return safe
    import hashlib

    return f"{safe[: ID_VALUE_MAX - 9]}~{hashlib.sha256(text.encode()).hexdigest()[:8]}"


def _shell_value(value: Any) -> str:
    if isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, str):
        return shlex.quote(value)
    return str(value)


def expand(spec: SweepSpec, python: str | None = None) -> list[RunSpec]:
    """grid x seeds -> runs, in a deterministic order with stable, readable ids.

    A search's runs are its trials (x seeds); their commands are bound when the sampler has chosen
    their params (`bind`), just before their first start."""
    seeds = seeds_of(spec)
    if spec.search is not None:
        several = len(seeds) > 1
        return [
            RunSpec(run_id=trial_id(n, seed if several else None), params={**spec.params, "seed": seed}, command="")
            for n in range(spec.search.trials)
            for seed in seeds
        ]
    axes = list(spec.grid.items())
    runs = []
    for point in itertools.product(*(values for _, values in axes)):
        for seed in seeds:
            chosen = dict(zip((k for k, _ in axes), point))
            parts = [f"{k}={_id_value(v)}" for k, v in chosen.items()]
            if len(seeds) > 1:
                parts.append(f"seed={seed}")
            run_id = ",".join(parts) or "run"
            params = {**spec.params, **chosen, "seed": seed}
            runs.append(RunSpec(run_id=run_id, params=params, command=command_of(spec, run_id, params, python)))
    return runs


def command_of(spec: SweepSpec, run_id: str, params: dict[str, Any], python: str | None) -> str:
    """The run's shell command: every placeholder filled, every value shell-quoted data."""
    from orchestrator.sweep.shapes import torchrun_text

    values = {k: _shell_value(v) for k, v in params.items()}
    # "auto": the interpreter is found on the first host; the run reads it from $ORCH_PYTHON
    py = '"$ORCH_PYTHON"' if python == AUTO_PYTHON else shlex.quote(python or sys.executable)
    values.update(python=py, sweep=spec.name, run_id=shlex.quote(run_id), torchrun=torchrun_text(py))
    return spec.command.format(**values)


def bind(spec: SweepSpec, run: RunSpec, chosen: dict[str, Any]) -> RunSpec:
    """A trial's run with the values its sampler chose: params and command."""
    params = {**run.params, **chosen}
    return RunSpec(run_id=run.run_id, params=params, command=command_of(spec, run.run_id, params, host_python(spec)))
