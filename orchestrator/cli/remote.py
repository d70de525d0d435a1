"""`orch launch --remote` (the laptop's side) and `orch _supervise` (what runs on the controller's instance)."""

from __future__ import annotations

import logging
import math
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import click

from orchestrator.backends.aws.backend import AwsBackend
from orchestrator.backends.aws.cloud import ec2 as api
from orchestrator.backends.aws.cloud.ec2 import terminate
from orchestrator.backends.aws.cloud.pricing import on_demand_price
from orchestrator.backends.aws.regions import home_region
from orchestrator.backends.aws.regions import settings as aws_settings
from orchestrator.backends.aws.remote import (
    RemoteSettings,
    check_remote,
    ensure_own_key,
    launch_controller,
    live_controllers,
    remote_view,
)
from orchestrator.backends.base import Backend
from orchestrator.backends.registry import backend_for, load_sweep
from orchestrator.cli.common import expected_errors, sweep_parts
from orchestrator.control.controller import Controller
from orchestrator.control.launch import STOPPED_CODE
from orchestrator.control.lease import read_lease, refusal
from orchestrator.control.state import SweepLock
from orchestrator.control.supervisor import Supervisor
from orchestrator.control.views import usd
from orchestrator.control.watchdog import Watchdog
from orchestrator.errors import OrchError
from orchestrator.host.aws.imds import ask_imds_patiently
from orchestrator.store import layout, open_store
from orchestrator.store.base import Store
from orchestrator.sweep.spec import Sweep
from orchestrator.wait import Timeout, retry_until

STARTING_S = 900.0  # a controller instance younger than this may still be installing and taking the sweep
FIRST_PASS_S = 300.0  # after the install: the supervisor starts, the controller takes the lease (its first pass)


def check(sweep) -> None:
    """What --remote needs beyond a launch, refused (exit 2) before anything is bought."""
    check_remote(sweep)


def controller_backend(sweep, settings_file: str) -> Backend:
    """On the controller's instance: its backend sees the sweep with the controller's own key, group and profile,
    `notify:`'s url_env sinks as the laptop had them, and the home region the laptop found (the cost ledger's)."""
    settings = RemoteSettings.read(Path(settings_file))
    os.environ.update(settings.notify_env)
    backend = backend_for(remote_view(sweep, settings))
    if isinstance(backend, AwsBackend):  # its role may not ask the bucket's region: the laptop recorded it
        backend.state.ledger.home = settings.region
    return backend


def controller_line(sweep, plan) -> str:
    """--remote's part of the bound: the controller's on-demand hours while the runs can last, and max_hours (the
    controller's instance ends then, whatever the runs do)."""

    ctl, spec = sweep.spec.aws.controller, sweep.spec
    waves = math.ceil(len(sweep.runs) / max(1, min(spec.max_parallel, len(sweep.runs) or 1)))
    cap = float(ctl.max_hours)
    hours = min(cap, waves * plan["hours_per_run_max"])
    # runs of a few minutes showed as "0.0 h": minutes below an hour
    while_runs = f"at most {_duration(hours)} while the runs last ({waves} wave(s) of max_parallel x each run's limit)"
    ends = f"aws.controller.max_hours ({_duration(cap)}) ends it"
    home = (plan.get("transfer") or {}).get("home") or sweep.spec.aws.region  # the controller runs in the home region
    price = on_demand_price(ctl.instance_type, None, home)
    where = f"; it runs in the home region {home} (the store's bucket's)"
    if price is None:
        return (
            f"controller: {ctl.instance_type} on demand for {while_runs}; {ends} (its price is unknown to orch){where}"
        )
    est = plan["estimate_usd_max"]
    total = f"; with the runs at most {usd(est + price * hours, at_most=True)}" if est is not None else ""
    runs_bound = usd(price * hours, at_most=True)
    return (
        f"controller: {ctl.instance_type} on demand at ${price:.4f}/h x {while_runs} = {runs_bound}{total}; "
        f"{ends}: {usd(price * cap, at_most=True)} at the most{where}"
    )


def _duration(hours: float) -> str:
    return (
        f"{max(1, round(hours * 60))} min" if hours < 1 else f"{hours:g} h" if hours == int(hours) else f"{hours:.1f} h"
    )


def launch_remote(con, sweep: Sweep) -> None:
    """Validate and prepare here as a launch does, start the controller on its instance, return once its lease is
    in the store (or adopt the one that already runs)."""

    check_remote(sweep)
    backend, store, state = sweep_parts(sweep)
    if not isinstance(backend, AwsBackend):  # check_remote refused every other backend
        raise OrchError(f"{sweep.path}: --remote needs `backend: aws`", exit_code=2)
    name = sweep.spec.name
    lease, _ = read_lease(store, name)
    if lease is not None and lease.alive():
        if not lease.holder.instance_id:
            raise OrchError(refusal(name, lease, str(sweep.path)), exit_code=2)
        con.print(
            f"sweep {name} already runs on its remote controller: {lease.holder.where()}, last heartbeat "
            f"{lease.age():.0f} s ago. Adopted; nothing new started.",
            markup=False,
        )
        _follow(con, name)
        return
    lock, began = SweepLock(state.home, name), time.time()
    lock.clear_stop()  # a launch after `orch down` runs the sweep again; a stop from here on ends this one (143)
    backend.preflight()
    new = Controller(sweep, backend, store, state).prepare()
    home = backend.state.part(home_region(sweep)).ec2  # the controller runs in the sweep's home region
    if _adopt_or_clear(con, home, store, sweep, live_controllers(home, sweep)):
        _follow(con, name)
        return
    con.print(
        f"{'launching' if new else 'continuing'} sweep [bold]{name}[/]: {len(sweep.runs)} runs, max_parallel "
        f"{sweep.spec.max_parallel}, store {sweep.store_url}; its controller on a "
        f"{aws_settings(sweep).controller.instance_type}"
    )
    try:
        ctl = launch_controller(backend.state, backend.bootstrap(), say=lambda text: con.print(text, markup=False))
    except Exception:  # `orch down` removed the instance being installed: the stop, not the broken install, is news
        if lock.stop_asked():
            raise _stopped(name, "") from None
        raise
    holder = _wait_first_pass(store, name, ctl, lambda lease: lock.stop_asked() or _stop_since(lease, began))
    if holder == ctl.instance_id:
        con.print(
            f"the controller runs on instance {ctl.instance_id} ({ctl.instance_type}, {ctl.region}); this machine "
            "may sleep now.",
            markup=False,
        )
    else:  # another launch raced this one and its controller took the sweep first: ours serves nobody
        terminate(home, [ctl.instance_id])
        con.print(
            f"another launch's controller on {holder} took the sweep first; this launch's instance "
            f"{ctl.instance_id} is terminated. Adopted; nothing new started.",
            markup=False,
        )
    _follow(con, name)


def _adopt_or_clear(con, ec2, store: Store, sweep: Sweep, found: list) -> bool:
    """Controller instances of the sweep that exist although no live lease did when this launch began. One that is
    young may be another launch's, still starting: wait for it to take the sweep and adopt it (True). One that never
    took it, or whose lease lapsed, serves nobody: terminate it."""

    name = sweep.spec.name
    for old in found:
        iid = old["instance_id"]

        def holds() -> bool:
            lease, _ = read_lease(store, name)
            return lease is not None and lease.alive() and lease.holder.instance_id == iid

        left = (old.get("launch_time") or 0.0) + STARTING_S - time.time()
        held = holds()
        if held or left > 0:
            if not held:
                con.print(f"another launch is starting this sweep's controller on {iid}; waiting for it", markup=False)
            try:
                if not held:  # left > 0 here
                    retry_until(holds, left, 2.0, f"the controller on {iid} to take the sweep")
                con.print(f"sweep {name} runs on its remote controller {iid}. Adopted; nothing new started.")
                return True
            except Timeout:
                pass
        terminate(ec2, [iid])
        con.print(f"terminated {iid}, the sweep's earlier controller (it does not hold the sweep)", markup=False)
    return False


def _stopped(name: str, instance_id: str) -> OrchError:
    gone = f"; its instance {instance_id} is terminated" if instance_id else ""
    return OrchError(
        f"stopped by `orch down {name}` before its remote controller took the sweep{gone}: no controller continues "
        "this sweep.",
        exit_code=STOPPED_CODE,
    )


def _stop_since(lease, began: float) -> bool:
    """`orch down` from another machine asked the sweep's lease to stop since this launch began."""
    return lease is not None and (lease.stop_requested or 0.0) >= began


def _wait_first_pass(store, name: str, ctl, stop_asked: Callable[[object], bool]) -> str:
    """The instance whose controller took the sweep: this launch's, or a racing launch's. `orch down` meanwhile (here,
    or through the lease from elsewhere) ends the wait: exit 143, as for any launch it stops."""

    def taken() -> str:
        lease, _ = read_lease(store, name)
        if stop_asked(lease):
            raise _stopped(name, ctl.instance_id)
        if lease is None or not lease.holder.instance_id:
            return ""
        mine = lease.holder.instance_id == ctl.instance_id
        return lease.holder.instance_id if mine or lease.alive() else ""

    try:
        return retry_until(taken, FIRST_PASS_S, 1.0, "the remote controller's first pass")
    except OrchError:  # stopped: `orch down` may have listed the instances before this one ran
        api.terminate(api.client("ec2", ctl.region), [ctl.instance_id])
        raise
    except Timeout:
        log = (store.get_bytes(layout.controller_log_key(name)) or b"").decode(errors="replace")[-1500:]
        api.terminate(api.client("ec2", ctl.region), [ctl.instance_id])
        raise OrchError(
            f"the controller on {ctl.instance_id} did not take the sweep within {FIRST_PASS_S:.0f} s; its instance "
            f"is terminated. Its log:\n{log or '(none in the store)'}\n`orch down {name}` removes the rest."
        ) from None


def _follow(con, name: str) -> None:
    con.print(
        f"Follow: `orch status {name} --watch`, its log: `orch logs --controller {name}`. "
        f"Stop everything: `orch down {name}`.",
        markup=False,
    )


@click.command("_supervise", hidden=True)
@click.argument("settings_file", type=click.Path(exists=True, dir_okay=False))
@expected_errors
def supervise_cmd(settings_file: str):
    """On the controller's instance: run the sweep's controller, restarting it, until the sweep is done."""

    ask_imds_patiently(os.environ)  # its credentials (and its controller's) come from the instance metadata service
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    settings = RemoteSettings.read(Path(settings_file))
    sweep = load_sweep(settings.sweep_file)
    log_path = Path(settings_file).with_name("controller.log")

    def terminate(instance_id: str) -> None:
        api.terminate(api.client("ec2", settings.region), [instance_id])

    store = open_store(sweep.store_url)
    supervisor = Supervisor(
        settings, sweep.spec.name, store, log_path, terminate, prepare=lambda: ensure_own_key(settings)
    )
    ending = supervisor.run()
    click.echo(f"supervisor ended: {ending.reason}")


@click.command("_watchdog", hidden=True)
@click.argument("settings_file", type=click.Path(exists=True, dir_okay=False))
@expected_errors
def watchdog_cmd(settings_file: str):
    """On the controller's instance: terminate it once its sweep's lease ended or lapsed (control/watchdog.py)."""

    ask_imds_patiently(os.environ)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    settings = RemoteSettings.read(Path(settings_file))
    sweep = load_sweep(settings.sweep_file)

    def terminate(instance_id: str) -> None:
        api.terminate(api.client("ec2", settings.region), [instance_id], patience_s=30.0)

    def shutdown() -> None:  # the instance's shutdown behaviour is `terminate` (backends/aws/remote.py)
        subprocess.run(["sudo", "-n", "shutdown", "-h", "now"], check=True, capture_output=True, timeout=60)

    log_path = Path(settings_file).with_name("controller.log")
    Watchdog(settings, sweep.spec.name, open_store(sweep.store_url), log_path, terminate, shutdown).run()
