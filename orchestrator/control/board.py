"""The store as a TensorBoard log directory (`orch tensorboard`, `orch collect --tensorboard`).

One folder per run: each metrics.jsonl line becomes scalars at its `step` (else its `epoch`, else its
line number), written with TensorBoard's own event writer; the run's parameters are its HParams
(session start), and its final and best metrics — with `target:` whether and when it was reached,
on AWS its dollars — are scalars under `hparams/` that the HParams dashboard lists as metrics.

Kept current pass after pass: per run, the byte offset of the metrics file already converted and the
last step written are kept in `<logdir>/.orch-board.json`; a pass converts only new complete lines,
and a line whose step is not past the last one written (a resumed attempt writing again the steps
its predecessor wrote after its last checkpoint) is skipped, so a curve never doubles back. Only runs
that are live, or not yet converted since they ended, are read: a pass costs O(active runs).
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.backends.registry import costs_of
from orchestrator.contract import finite, keep_best
from orchestrator.errors import OrchError
from orchestrator.store import layout
from orchestrator.store.base import Store, read_jsonl
from orchestrator.store.status import CANCELLED, FAILED, PRUNED, SUCCEEDED, read_status
from orchestrator.sweep.spec import Sweep

STATE_FILE = ".orch-board.json"
INSTALL = "pip install 'orch[board]'   (or: pip install tensorboard)"
STEP_KEYS = ("step", "epoch")
SKIP = ("time",)  # not a curve
FINAL = (SUCCEEDED, FAILED, CANCELLED, PRUNED)


def need_tensorboard() -> None:
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        raise OrchError(
            f"TensorBoard is not installed (it is an optional extra). Install it: {INSTALL}", exit_code=2
        ) from None


@dataclass
class RunBoard:
    offset: int = 0  # bytes of metrics.jsonl converted
    step: float | None = None  # last step written
    index: int = 0  # lines converted (the step of lines without step/epoch)
    done: bool = False  # converted after the run ended: never read again
    best: dict[str, float] = field(default_factory=dict)
    last: dict[str, float] = field(default_factory=dict)


class Board:
    def __init__(self, sweep: Sweep, store: Store, logdir: Path, option: str = "--logdir"):
        need_tensorboard()
        self.sweep, self.store, self.logdir = sweep, store, Path(logdir)
        self.name = sweep.spec.name
        try:  # a folder that exists but cannot be written fails here, not halfway through the first run
            self.logdir.mkdir(parents=True, exist_ok=True)
            tempfile.TemporaryFile(dir=self.logdir).close()
        except OSError as exc:
            raise OrchError(
                f"cannot write the TensorBoard folder {self.logdir}: {exc.strerror or exc}. Pass another with "
                f"{option}.",
                exit_code=2,
            ) from None
        self.runs: dict[str, RunBoard] = {}
        self._runs = list(sweep.runs)  # with `search:`, bound to their trials' params at each pass
        saved = self._load()
        for rid, data in saved.get("runs", {}).items():
            with contextlib.suppress(TypeError):
                self.runs[rid] = RunBoard(**data)
        self.writers: dict[str, Any] = {}
        self.metric_tags: list[str] = list(saved.get("metric_tags", []))
        self.passes = 0

    # --- one pass ----------------------------------------------------------------------------

    def update(self) -> int:
        """Convert what is new; returns the number of lines written in this pass."""
        from orchestrator.control.summary import read as read_summary

        self.passes += 1
        self._costs: dict[str, tuple] | None = None  # the ledger, read when the first run of this pass needs it
        from orchestrator.control.trials import search_results

        self._runs = search_results(self.sweep, self.store)[0]  # a search's trials with the params they were given
        order = [r.run_id for r in self._runs]
        views = read_summary(self.store, self.name, order)
        wrote = 0
        for run in self._runs:
            rb = self.runs.get(run.run_id)
            if rb is not None and rb.done:
                continue
            view = views.get(run.run_id) if views else None
            if view is not None and view.state == "queued" and rb is None:
                continue  # nothing to read yet
            wrote += self._convert(run, rb or RunBoard())
        self._experiment()
        self._save()
        for w in self.writers.values():
            w.flush()
        return wrote

    def _convert(self, run, rb: RunBoard) -> int:
        from orchestrator.control.target import to_target

        data = self.store.get_bytes(layout.metrics_key(self.name, run.run_id)) or b""
        status = read_status(self.store, self.name, run.run_id)
        new = data[rb.offset :]
        complete = new[: new.rfind(b"\n") + 1] if b"\n" in new else b""
        if status.state in FINAL and new[len(complete) :].strip():
            complete = new  # the command has ended: its last line will get no newline now, and is whole
        fresh = run.run_id not in self.runs  # first seen by this log directory: its HParams session starts
        self.runs[run.run_id] = rb
        writer = self._writer(run.run_id)
        if fresh:
            self._session(run, writer)
        lines = read_jsonl(complete)
        wrote = 0
        for line in lines:
            step = next((finite(line.get(k)) for k in STEP_KEYS if finite(line.get(k)) is not None), None)
            rb.index += 1
            step = float(rb.index) if step is None else step
            if rb.step is not None and step <= rb.step:
                continue  # a resumed attempt writing again what the run already has
            rb.step = step
            wall = finite(line.get("time")) or time.time()
            values = {k: v for k, v in ((k, finite(v)) for k, v in line.items() if k not in SKIP) if v is not None}
            self._scalars(writer, values, step, wall)
            for k, v in values.items():
                rb.last[k] = v
                keep_best(rb.best, k, v)
            wrote += 1
        rb.offset += len(complete)
        if wrote or status.state in FINAL:
            hp = {f"hparams/final_{k}": v for k, v in rb.last.items() if k not in STEP_KEYS}
            hp.update({f"hparams/best_{k}": v for k, v in rb.best.items()})
            target = self.sweep.spec.target
            if target is not None:
                t = to_target(target, read_jsonl(data), status.first_started_at, None, run.run_id)
                hp["hparams/reached"] = 1.0 if t.reached else 0.0
                if t.time_to_target_s is not None:
                    hp["hparams/time_to_target_s"] = t.time_to_target_s
            cost = self._cost(run.run_id)
            if cost is not None:
                hp["hparams/usd"] = cost
            self._scalars(writer, hp, rb.step or 0.0, time.time())
            for tag in hp:
                if tag not in self.metric_tags:
                    self.metric_tags.append(tag)
        if status.state in FINAL and not new[len(complete) :].strip():
            rb.done = True  # ended and converted: never read again
        return wrote

    def _cost(self, run_id: str) -> float | None:
        """The run's dollars from the sweep's cost ledger, read once per pass (backends that count dollars)."""
        reader = costs_of(self.sweep)
        if reader is None:
            return None
        if self._costs is None:
            from orchestrator.store.base import get_json

            self._costs = reader.per_run(get_json(self.store, layout.cost_key(self.name)) or {})
        return self._costs[run_id][0] if run_id in self._costs else None

    # --- writing -----------------------------------------------------------------------------

    def _writer(self, run_id: str):
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        if run_id not in self.writers:
            self.writers[run_id] = EventFileWriter(str(self.logdir / run_id))
        return self.writers[run_id]

    def _scalars(self, writer, values: dict[str, float], step: float, wall: float) -> None:
        if not values:
            return
        event, summary = _protos()
        scalars = summary(value=[summary.Value(tag=k, simple_value=v) for k, v in values.items()])
        step = min(max(step, -(2**63)), 2**63 - 1)  # an event's step is an int64: a "step": 1e30 is drawn at its end
        writer.add_event(event(wall_time=wall, step=int(step), summary=scalars))

    def _session(self, run, writer) -> None:
        from tensorboard.plugins.hparams import summary_v2 as hp

        params = {k: v for k, v in run.params.items() if isinstance(v, (bool, int, float, str))}
        event, _ = _protos()
        writer.add_event(event(wall_time=time.time(), summary=hp.hparams_pb(params, trial_id=run.run_id)))

    def _experiment(self) -> None:
        """The HParams dashboard's columns: every param of the sweep, every metric written so far."""
        from tensorboard.plugins.hparams import summary_v2 as hp

        key = json.dumps(self.metric_tags)
        if getattr(self, "_experiment_key", None) == key:
            return
        self._experiment_key = key
        values: dict[str, list] = {}
        space = set(self.sweep.spec.search.space) if self.sweep.spec.search is not None else set()
        for run in self._runs:
            for k, v in run.params.items():
                if isinstance(v, (bool, int, float, str)) and v not in values.setdefault(k, []):
                    values[k].append(v)
        hparams = []
        for k, vs in values.items():
            same = all(type(v) is type(vs[0]) for v in vs) and not isinstance(vs[0], bool)
            # a search's params are sampled as it goes: no fixed domain (one would hide later trials)
            hparams.append(hp.HParam(k, hp.Discrete(vs)) if same and k not in space else hp.HParam(k))
        pb = hp.hparams_config_pb(hparams=hparams, metrics=[hp.Metric(t) for t in self.metric_tags])
        self._experiment_pb = pb
        event, _ = _protos()
        for run_id in list(self.runs):  # in each run's own folder (a folder of its own would show as one more run)
            self._writer(run_id).add_event(event(wall_time=time.time(), summary=pb))

    # --- state -------------------------------------------------------------------------------

    def _load(self) -> dict:
        try:
            data = json.loads((self.logdir / STATE_FILE).read_text())
            return data if isinstance(data, dict) and data.get("sweep") == self.name else {}
        except (OSError, ValueError):
            return {}

    def _save(self) -> None:
        from dataclasses import asdict

        doc = {
            "sweep": self.name,
            "metric_tags": self.metric_tags,
            "runs": {rid: asdict(rb) for rid, rb in self.runs.items()},
        }
        tmp = self.logdir / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(doc))
        tmp.replace(self.logdir / STATE_FILE)

    def close(self) -> None:
        for w in self.writers.values():
            w.close()


def _protos() -> tuple[Any, Any]:
    """TensorBoard's Event and Summary messages (imported when a board is written: tensorboard is heavy)."""
    from tensorboard.compat.proto import event_pb2, summary_pb2

    # protobuf builds these classes when the module loads, and tensorboard ships no stubs that declare them
    return event_pb2.Event, summary_pb2.Summary  # pyright: ignore[reportAttributeAccessIssue]
