"""orch command line: the `orch` group. Each command lives in a module of its own (listed in COMMANDS) that is
imported only when that command runs, so its imports sit at the top of the module and `orch --help` stays
instant (click's "lazy loading subcommands"). Each command parses, calls one function, prints; only the CLI
(this package) prints."""

from __future__ import annotations

import importlib

import click

EPILOG = (
    "Docs: README.md and the site in docs/ (scripts/docs.sh serves it). "
    "Runs keep going when orch exits; `orch down SWEEP` stops everything."
)

# name -> ("module:attribute", the first line of its help, shown by `orch --help` without importing the module;
# a test checks it against the command's own). Hidden commands have no help line.
COMMANDS: dict[str, tuple[str, str | None]] = {
    "launch": ("orchestrator.cli.launch:launch", "Launch (or continue) the sweep in SWEEP_FILE and watch it."),
    "_controller": ("orchestrator.cli.launch:controller_cmd", None),
    "status": (
        "orchestrator.cli.status:status",
        "Show the runs of SWEEP (a name or a sweep file), or every sweep launched from here.",
    ),
    "collect": (
        "orchestrator.cli.status:collect",
        "Gather SWEEP's results: a table here, runs.csv, runs.json and curves.png in --out.",
    ),
    "cancel": ("orchestrator.cli.runs:cancel", "Stop RUN for good: its command is terminated and it is not retried."),
    "attach": (
        "orchestrator.cli.runs:attach",
        "Open an interactive terminal in RUN's tmux session (detach: Ctrl-b d).",
    ),
    "logs": ("orchestrator.cli.runs:logs", "Print RUN's log (the command's stdout and stderr) from the store."),
    "down": (
        "orchestrator.cli.ops:down",
        "Stop everything of SWEEP: its controller, every run, and (aws) its instances, launch template, security "
        "group and instance profile.",
    ),
    "forget": (
        "orchestrator.cli.ops:forget",
        "Take SWEEP off this machine's list of sweeps, so that its name may name another sweep (a second clone's, "
        "say).",
    ),
    "gc": (
        "orchestrator.cli.ops:gc",
        "List what orch made and what still exists (instances, security groups, launch templates; instance "
        "profiles once, under `iam`: IAM is global), by sweep, in the regions of the sweeps launched from here, each "
        "with the command that removes it (`orch down SWEEP`; an image build's leftovers: `orch down ami-RECIPE`; "
        "images themselves: `orch ami list` / `orch ami rm`).",
    ),
    "chaos": (
        "orchestrator.cli.ops:chaos",
        "Fault injection: prove that your training code survives what spot instances do to it.",
    ),
    "data": ("orchestrator.cli.ops:data", "Data sets for the `data:` entries of sweeps."),
    "aws": ("orchestrator.cli.aws:aws_group", "AWS setup: what the credentials that run orch need."),
    "ami": (
        "orchestrator.cli.ami:ami",
        "Images built by orch from a recipe (default ami/recipe.yaml); sweeps use them with `image: recipe:NAME`.",
    ),
    "tensorboard": (
        "orchestrator.cli.board:tensorboard",
        "Show SWEEP in TensorBoard, live: every run's metrics as scalars, its params and final/best metrics as "
        "HParams.",
    ),
    "_supervise": ("orchestrator.cli.remote:supervise_cmd", None),
    "_watchdog": ("orchestrator.cli.remote:watchdog_cmd", None),
    "notify": (
        "orchestrator.cli.notify:notify_group",
        "Notifications of a sweep (`notify:` in the sweep file; docs/guides/notifications.md).",
    ),
    "_notify": ("orchestrator.cli.notify:notify_drain_cmd", None),
}


class LazyGroup(click.Group):
    """A group whose commands are imported when one runs; its help lists them from COMMANDS."""

    def __init__(self, *args, lazy: dict[str, tuple[str, str | None]], **kwargs):
        super().__init__(*args, **kwargs)
        self.lazy = lazy

    def list_commands(self, ctx: click.Context):
        return sorted([*super().list_commands(ctx), *self.lazy])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.lazy:
            return super().get_command(ctx, cmd_name)
        module, attr = self.lazy[cmd_name][0].split(":")
        cmd = getattr(importlib.import_module(module), attr)
        if not isinstance(cmd, click.Command):
            raise TypeError(f"{module}:{attr} is not a click command")
        return cmd

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        shown = [(name, text) for name, (_, text) in self.lazy.items() if text is not None]
        if not shown:
            return
        limit = formatter.width - 6 - max(len(name) for name, _ in shown)
        rows = [(name, click.Command(name, help=text).get_short_help_str(limit)) for name, text in sorted(shown)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, lazy=COMMANDS, epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="orch")
def main():
    """Run deep-learning experiment sweeps on spot GPUs or on this machine.

    \b
    Example:
      orch launch experiments/local-smoke.yaml
      orch status
      orch collect local-smoke
    """


if __name__ == "__main__":
    main()
