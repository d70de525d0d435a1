"""MkDocs hooks (mkdocs.yml `hooks:`): the reference pages generated from the code at every build, so they cannot
drift. Each page is built from what orch itself uses: the pydantic models of sweep.yaml (the generic one and each
backend's settings model from backends/registry.py), click's command tree (rendered by mkdocs-click), the
transitions of store/lifecycle.py (driven, not parsed) and the policies orch prints. tests/repo/test_docs_site.py checks
the built pages against the code a second, independent way."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

# page path under docs/ -> the function that writes it
GENERATED = {
    "reference/sweep-file.md": "sweep_file_page",
    "reference/cli.md": "cli_page",
    "reference/aws-calls.md": "aws_calls_page",
    "concepts/lifecycle.md": "lifecycle_page",
}


# --- sweep.yaml, from the models' JSON schema -------------------------------------------------------------


def _type_of(schema: dict[str, Any], defs: dict[str, Any]) -> str:
    if "$ref" in schema:
        return "section: " + schema["$ref"].rsplit("/", 1)[1]
    if "anyOf" in schema:
        return " or ".join(_type_of(s, defs) for s in schema["anyOf"])
    if "enum" in schema:
        return " | ".join(json.dumps(v) for v in schema["enum"])
    if "const" in schema:
        return json.dumps(schema["const"])
    kind = schema.get("type", "any")
    if kind == "array":
        return f"list of {_type_of(schema.get('items', {}), defs)}"
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        return f"map of name to {_type_of(schema['additionalProperties'], defs)}"
    return str(kind)


CONSTRAINTS = (
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "gt",
    "ge",
    "lt",
    "le",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
)


def _constraints(schema: dict[str, Any]) -> list[str]:
    found = [f"{k}: `{schema[k]}`" for k in CONSTRAINTS if k in schema]
    for sub in schema.get("anyOf", []):
        found += _constraints(sub)
    if "items" in schema:
        found += [f"each {c}" for c in _constraints(schema["items"])]
    return found


def _refs(schema: dict[str, Any]) -> Iterator[str]:
    if "$ref" in schema:
        yield schema["$ref"].rsplit("/", 1)[1]
    for sub in schema.get("anyOf", []):
        yield from _refs(sub)
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            yield from _refs(schema[key])


def field_rows(schema: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, dict[str, Any], bool]]:
    """(dotted path, the field's schema, required) for every field, nested sections after their parent's row."""
    defs = schema.get("$defs", {})
    required = set(schema.get("required", []))
    for name, prop in schema.get("properties", {}).items():
        path = f"{prefix}{name}"
        yield path, prop, name in required
        for ref in _refs(prop):
            sub = dict(defs[ref], **{"$defs": defs})
            many = "items" in prop or any("items" in s for s in prop.get("anyOf", []))
            mapped = isinstance(prop.get("additionalProperties"), dict)
            yield from field_rows(sub, f"{path}.NAME." if mapped else f"{path}[]." if many else f"{path}.")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _table(schema: dict[str, Any], prefix: str) -> list[str]:
    defs = schema.get("$defs", {})
    out = ["| field | type | default | constraints | description |", "|---|---|---|---|---|"]
    for path, prop, required in field_rows(schema, prefix):
        default = "*required*" if required else (f"`{json.dumps(prop['default'])}`" if "default" in prop else "")
        out.append(
            f'| <code id="field-{path}">{path}</code> | {_cell(_type_of(prop, defs))} | {_cell(default)} | '
            f"{_cell(', '.join(_constraints(prop)))} | {_cell(prop.get('description', ''))} |"
        )
    return out


def sweep_file_page() -> str:
    from orchestrator.backends import registry
    from orchestrator.sweep.spec import SweepSpec

    lines = [
        "# The sweep file (generated)",
        "",
        "Generated at every build from the pydantic models orch validates `sweep.yaml` with "
        "(`orchestrator/sweep/spec.py`, and each backend's settings model named in "
        "`orchestrator/backends/registry.py`). Every field, its type, default, constraints and description; "
        "a key not listed here is refused with its file:line. The guide pages explain how the fields work "
        "together.",
        "",
        "## Top level",
        "",
        *_table(SweepSpec.model_json_schema(), ""),
    ]
    for entry in registry.BACKENDS:
        model = entry.schema.settings
        lines += [
            "",
            f"## `{entry.name}:` (the `{entry.name}` backend's section)",
            "",
            f"Read when `backend: {entry.name}`; its model is `{model.__module__}.{model.__name__}`.",
            "",
            *_table(model.model_json_schema(), f"{entry.name}."),
        ]
    return "\n".join(lines) + "\n"


# --- the CLI, from click ----------------------------------------------------------------------------------


def shown_commands(group, ctx) -> dict[str, Any]:
    """The subcommands `--help` lists (a LazyGroup's with help text; click's own, not hidden), imported."""
    lazy = getattr(group, "lazy", {})
    names = [n for n in group.list_commands(ctx) if n not in lazy or lazy[n][1] is not None]
    found = {n: group.get_command(ctx, n) for n in names}
    return {n: c for n, c in found.items() if c is not None and not c.hidden}


def _load_lazy_commands() -> None:
    # mkdocs-click walks `group.commands`; orch's LazyGroup fills it only when a command runs
    import click

    from orchestrator.cli.main import main

    def fill(group, ctx):
        for name, cmd in shown_commands(group, ctx).items():
            group.commands[name] = cmd
            if isinstance(cmd, click.Group):
                fill(cmd, click.Context(cmd, info_name=name, parent=ctx))

    fill(main, click.Context(main, info_name="orch"))


def cli_page() -> str:
    _load_lazy_commands()
    return (
        "# The CLI (generated)\n\nGenerated at every build from orch's click commands "
        "(`orchestrator/cli/`) by mkdocs-click: every command, argument and option with its help.\n\n"
        "::: mkdocs-click\n    :module: orchestrator.cli.main\n    :command: main\n    :prog_name: orch\n"
        "    :depth: 1\n    :style: table\n    :list_subcommands: true\n"
    )


# --- AWS calls and permissions -----------------------------------------------------------------------------

CALL_TABLE_HEADING = "## Every AWS call orch makes, the errors that can reach it, and what happens"


def call_table() -> str:
    page = (ROOT / "docs" / "aws.md").read_text()
    section = page.split(CALL_TABLE_HEADING, 1)[1]
    return re.split(r"\n## ", section, maxsplit=1)[0]


def aws_calls_page() -> str:
    from orchestrator.backends.aws.cloud import policy

    bucket = "YOUR-BUCKET"
    return "\n".join(
        [
            "# AWS calls and permissions (generated)",
            "",
            "Every AWS call orch makes (the table of [orch on AWS](../aws.md), kept complete against the code by "
            "`tests/unit/backends/aws/cloud/test_call_table.py`), and the policy and boundary exactly as "
            "`orch aws policy` and `orch aws boundary` print them (`orchestrator/backends/aws/cloud/policy.py`). "
            "How to create them: [the admin's part](../getting-started/admin.md).",
            "",
            "## The calls",
            call_table().rstrip(),
            "",
            f"## The policy (`orch aws policy --bucket {bucket}`)",
            "",
            "```json",
            json.dumps(policy.controller_policy(bucket), indent=2),
            "```",
            "",
            f"## The boundary (`orch aws boundary --bucket {bucket}`)",
            "",
            "```json",
            json.dumps(policy.boundary_policy(bucket), indent=2),
            "```",
            "",
        ]
    )


# --- a run's life, from store/lifecycle.py -------------------------------------------------------------------


def transitions() -> list[tuple[str, str, str]]:
    """(from, to, transition) for every move the lifecycle allows, found by trying each transition on a record in
    each state (the functions refuse the others with Impossible)."""
    from orchestrator.store import lifecycle as lc

    tries = {
        "claim": lambda s: lc.claim(s, now=1.0),
        "recover": lambda s: lc.recover(s, 1),
        "requeue": lambda s: lc.requeue(s, "no capacity"),
        "fail": lambda s: lc.fail(s, "r", now=1.0),
        "give up": lambda s: lc.give_up(s, "r", now=1.0),
        "lose": lambda s: lc.lose(s, "r", now=1.0),
        "prune": lambda s: lc.prune(s, "r", {}, now=1.0),
        "cancel": lambda s: lc.cancel(s, "r", now=1.0),
        "reopen (budget raised)": lambda s: lc.reopen(s, "r"),
        "stop": lambda s: lc.stop(s, "r", now=1.0),
        "start": lambda s: lc.start(s, 1, "h", "r", now=1.0),
        "run": lambda s: lc.run(s, 1, "h", now=1.0),
        "interrupt": lambda s: lc.interrupt(s, "r", now=1.0),
    }
    for reason in lc.StopReason:
        tries[f"finish ({reason.value})"] = lambda s, r=reason: lc.finish(
            s, lc.Ending(r.to_state(), r.words(), r.failure), None, "", now=1.0
        )
    tries["finish (exit 0)"] = lambda s: lc.finish(s, lc.Ending(lc.RunState.SUCCEEDED, "", False), 0, "", now=1.0)
    tries["finish (exit 1)"] = lambda s: lc.finish(s, lc.Ending(lc.RunState.FAILED, "", True), 1, "", now=1.0)
    found = []
    for name, move in tries.items():
        for state in lc.RunState:
            try:
                after = move(lc.RunStatus(run_id="r", state=state, attempt=1))
            except lc.Impossible:
                continue
            found.append((state.value, after.state.value, name))
    return found


def lifecycle_page() -> str:
    edges: dict[tuple[str, str], list[str]] = {}
    for src, dst, name in transitions():
        edges.setdefault((src, dst), []).append(name)
    lines = [
        "# A run's life (generated)",
        "",
        "Drawn at every build by trying each transition of `orchestrator/store/lifecycle.py` on a record in "
        "each state: an arrow is a move the code allows, labelled with the transitions that make it. A run's "
        "record changes only through these functions (the controller's and the agent's).",
        "",
        "```mermaid",
        "stateDiagram-v2",
        "    [*] --> queued",
    ]
    lines += [f"    {s} --> {d}: {', '.join(sorted(n))}" for (s, d), n in sorted(edges.items())]
    lines += ["```", "", "| from | to | transitions |", "|---|---|---|"]
    lines += [f"| `{s}` | `{d}` | {', '.join(sorted(n))} |" for (s, d), n in sorted(edges.items())]
    return "\n".join(lines) + "\n"


# --- the hook ------------------------------------------------------------------------------------------------


def on_files(files, config):
    from mkdocs.structure.files import File

    for path, maker in GENERATED.items():
        files.append(File.generated(config, path, content=globals()[maker]()))
    return files


def on_page_content(html, page, config, files):
    # click 8.3 marks "no default" with a sentinel that mkdocs-click 0.9.0 prints as is
    return html.replace("<code>Sentinel.UNSET</code>", "")
