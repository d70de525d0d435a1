"""`orch notify test`: one message to every sink of a sweep's `notify:`; `orch _notify`: the background sender."""

from __future__ import annotations

import sys

import click

from orchestrator.cli.common import expected_errors, load_sweep_arg


@click.group("notify")
def notify_group():
    """Notifications of a sweep (`notify:` in the sweep file; docs/guides/notifications.md)."""


@notify_group.command("test")
@click.argument("sweep_file", type=click.Path(dir_okay=False))
@expected_errors
def notify_test_cmd(sweep_file: str):
    """Send one test message to every sink in SWEEP_FILE's `notify:` and say per sink whether it was delivered.

    Nothing is launched and nothing is recorded. Exits 1 when any sink did not take it.

    \b
    Example:
      ORCH_SLACK='slack://T000/B000/XXXX' orch notify test sweep.yaml
    """
    from orchestrator.control import notify as notify_api

    sweep = load_sweep_arg(sweep_file)
    if not sweep.spec.notify:
        raise click.UsageError(f"{sweep_file} has no `notify:` section: add one (docs/guides/notifications.md)")
    notify_api.check(sweep)
    failed = 0
    for d in notify_api.send_test(sweep):
        if d.delivered:
            click.echo(f"delivered  {d.label}")
        else:
            failed += 1
            click.echo(f"FAILED     {d.label}: {d.error}")
    if failed:
        click.echo(f"{failed} sink(s) did not take the message: check the URL, the receiver, the network.", err=True)
        sys.exit(1)


@click.command("_notify", hidden=True)
@click.argument("sweep_file")
@expected_errors
def notify_drain_cmd(sweep_file: str):
    """The background sender: delivers what a controller left pending, for up to 15 minutes."""
    import logging

    from orchestrator.control import notify as notify_api
    from orchestrator.store import open_store

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    sweep = load_sweep_arg(sweep_file)
    store = open_store(sweep.store_url)
    sys.exit(1 if notify_api.drain(store, sweep) else 0)
