"""`orch status` and `orch collect`: a sweep's runs as they are, and its results."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import click

from orchestrator.cli.common import expected_errors, explained, load_sweep_arg, make_console, sweep_parts
from orchestrator.cli.render import (
    curves_line,
    results_notes,
    results_table,
    runs_table,
    search_status_line,
    summary_line,
    watch_progress,
)
from orchestrator.control.actions import observe
from orchestrator.control.board import Board
from orchestrator.control.collect import collect as gather
from orchestrator.control.collect import write_outputs
from orchestrator.control.lease import read_lease
from orchestrator.control.notify import status_lines
from orchestrator.control.state import State, SweepLock, store_holds
from orchestrator.control.trials import search_progress
from orchestrator.wait import retry_until


def _status_of_every_sweep(con, as_json: bool) -> None:
    """`orch status` without a sweep: one line per sweep launched from here (a sweep out of reach says why)."""

    state = State()
    rows = []
    for rec in state.sweeps():
        holder = SweepLock(state.home, rec.name).holder()
        if holder is None and not store_holds(rec):  # a deleted clone's, say: listed this once, then no more
            state.forget(rec.name)
            summary = f"gone: its store holds no sweep.json any more; forgotten here (launch {rec.spec_path} anew)"
        else:
            summary = _one_line(rec.name)
        rows.append(
            {
                "sweep": rec.name,
                "backend": rec.backend,
                "store": rec.store_url,
                "runs": summary,
                "controller_pid": holder,
            }
        )
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        con.print("no sweeps launched from here yet. Start one: `orch launch experiments/local-smoke.yaml`.")
    for row in rows:
        ctl = f", controller pid {row['controller_pid']}" if row["controller_pid"] else ""
        con.print(f"{row['sweep']} ({row['backend']}{ctl}): {row['runs']}  store={row['store']}", markup=False)


def _one_line(name: str) -> str:
    """A sweep's runs in a line; one out of reach (its cloud's credentials, say) says why, and hides no other."""
    try:
        sw = load_sweep_arg(name)
        backend, store, _ = sweep_parts(sw)
        return summary_line(observe(sw, backend, store))
    except Exception as exc:
        err = explained(exc)
        if err is None:
            raise
        return f"unreadable: {err}"


@click.command()
@click.argument("sweep", required=False)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--watch", is_flag=True, help="Keep the table live until the sweep is done.")
@click.option(
    "--all",
    "every",
    is_flag=True,
    help="Read every run's record and list every run (by default: the sweep's summary record, the records of "
    "active runs, and a table of active and newest finished runs with counts per state).",
)
@expected_errors
def status(sweep: str | None, as_json: bool, watch: bool, every: bool):
    """Show the runs of SWEEP (a name or a sweep file), or every sweep launched from here.

    It reads the sweep's summary record and the records of its active runs: a
    second at any sweep size. --json lists every run (from the summary).

    \b
    Example:
      orch status local-smoke --json
    """

    con = make_console()
    if sweep is None:
        _status_of_every_sweep(con, as_json)
        return
    sw = load_sweep_arg(sweep)
    backend, store, _ = sweep_parts(sw)
    if as_json:
        p = observe(sw, backend, store, every)
        lease = read_lease(store, sw.spec.name)[0]
        click.echo(
            json.dumps(
                {
                    "sweep": p.sweep,
                    "done": p.done,
                    "spend_usd": p.spend_usd,
                    "budget_usd": p.budget_usd,
                    **({"deadline": asdict(p.deadline)} if p.deadline is not None else {}),
                    "runs": [asdict(r) for r in p.runs],
                    "controller": None if lease is None else {**lease.to_json(), "alive": lease.alive()},
                },
                indent=2,
            )
        )
        return
    if watch:

        def run_fn(on_progress):
            last = []

            def once():
                last[:] = [observe(sw, backend, store, every)]
                on_progress(last[0])
                return last[0].done

            retry_until(once, None, 1.0)
            return last[0]

        watch_progress(con, run_fn)
        return
    progress = observe(sw, backend, store, every)
    con.print(runs_table(progress, every))
    if sw.spec.search is not None:
        con.print(search_status_line(search_progress(sw, store)), markup=False)
    for line in status_lines(store, sw):
        con.print(line, markup=False)
    if not progress.done:
        con.print(_controller_line(sw, store), markup=False)


def _controller_line(sw, store) -> str:
    """Where the sweep's controller runs (its lease in the store), or that none does and how to continue."""

    lease, _ = read_lease(store, sw.spec.name)
    name, again = sw.spec.name, f"`orch launch {sw.path}`"
    if lease is not None and lease.alive():
        return f"controller: {lease.holder.where()}, last heartbeat {lease.age():.0f} s ago."
    if lease is not None and lease.ended is None:
        return (
            f"no controller is running for {name}: the one on {lease.holder.where()} is gone (no heartbeat for "
            f"{lease.age():.0f} s). Queued and interrupted runs will not start; continue the sweep with {again}."
        )
    return f"no controller is running for {name}: queued and interrupted runs will not start. Continue it with {again}."


@click.command()
@click.argument("sweep")
@click.option("--out", type=click.Path(file_okay=False), help="Output folder (default: results/<sweep>).")
@click.option(
    "--wide", is_flag=True, help="Show every column, however narrow the terminal (runs.csv always has them all)."
)
@click.option(
    "--tensorboard",
    "tb_dir",
    type=click.Path(file_okay=False),
    help="Also write TensorBoard event files there (one folder per run; needs the board extra). "
    "`orch tensorboard SWEEP` keeps them current and serves them.",
)
@click.option(
    "--metrics",
    "wanted",
    help="Comma-separated metrics for curves.png (default: the sweep's target/search/prune metric and every "
    "metric whose name ends in acc, accuracy or loss).",
)
@expected_errors
def collect(sweep: str, out: str | None, wide: bool, tb_dir: str | None, wanted: str | None):
    """Gather SWEEP's results: a table here, runs.csv, runs.json and curves.png in --out.

    \b
    Example:
      orch collect local-smoke --out results/smoke --metrics test_acc,lr
    """

    sw = load_sweep_arg(sweep)
    _, store, _ = sweep_parts(sw)
    results = gather(sw, store)
    out_dir = Path(out or Path("results") / sw.spec.name)
    con = make_console()
    table = results_table(results, width=con.width, wide=wide)
    con.width = max(con.width, table.needed_width)  # longer lines rather than cut ids, states, times
    con.print(table)  # before the files: a folder that cannot be written still leaves the results on screen

    for line in results_notes(results):
        con.print(line, markup=False)
    names = [m.strip() for m in wanted.split(",") if m.strip()] if wanted else None
    paths = write_outputs(results, out_dir, wanted=names)
    if tb_dir:
        board = Board(sw, store, Path(tb_dir), option="--tensorboard")
        n = board.update()
        board.close()
        con.print(
            f"wrote TensorBoard event files to {tb_dir} ({n} metrics lines). View: tensorboard --logdir {tb_dir}",
            markup=False,
        )
    con.print(f"wrote {', '.join(str(p) for p in paths)}", markup=False)
    if results.figure is not None:
        con.print(curves_line(results.figure), markup=False)
