"""Config resolution: defaults < --preset < --config FILE < $ORCH_PARAMS_JSON < flags, checked, into a
`presets.Config`."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from .presets import Config


def refuse(message: str) -> None:
    """A bad option, file or value: one `trainer: …` line and exit 2, before anything starts."""
    print(f"trainer: {message}", file=sys.stderr)
    raise SystemExit(2)


def _parse_bool(text: str) -> bool:
    low = str(text).lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _coerce(key: str, value: Any, default: Any, source: str) -> Any:
    kind = type(default)
    try:
        if kind is bool:
            return value if isinstance(value, bool) else _parse_bool(value)
        if kind is float:
            return float(value)
        if kind is int:
            if isinstance(value, float) and not value.is_integer():
                raise ValueError
            return int(value)
        return str(value)
    except (ValueError, argparse.ArgumentTypeError):
        refuse(f"{source}: {key}={value!r} is not a valid {kind.__name__}")


def _merge(cfg: dict[str, Any], updates: dict[str, Any], defaults: dict[str, Any], source: str) -> None:
    for key, value in updates.items():
        key = str(key).replace("-", "_")
        if key == "preset":
            continue
        if key not in defaults:
            close = [k for k in defaults if k.startswith(key[:3])]
            hint = f" (did you mean {', '.join(close[:3])}?)" if close else ""
            refuse(f"{source}: unknown option {key!r}{hint}. See `python -m trainer --help`.")
        cfg[key] = _coerce(key, value, defaults[key], source)


def _read_file(path: str) -> dict[str, Any]:
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        refuse(f"--config {path}: cannot be read: {why}")
    if path.endswith((".yaml", ".yml")):
        import yaml

        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f"{path}:{mark.line + 1}" if mark is not None else path
            refuse(f"{where}: not valid YAML: {getattr(exc, 'problem', None) or exc}")
    else:
        data = _parse_json(text, path)
    return _mapping(data, path)


def _parse_json(text: str, source: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        refuse(f"{source}:{exc.lineno}: not valid JSON: {exc.msg} (column {exc.colno})")


def _mapping(data: Any, source: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        refuse(f'{source}: expected a mapping of options (e.g. {{"lr": 0.1}}), got a {type(data).__name__}')
    return data


USAGE = """The bundled trainer: DAWNBench-class image classification, resumable at any moment.

    python -m trainer --preset digits                      # one process, CPU or one GPU
    torchrun --nproc_per_node 8 -m trainer --preset dawnbench-rn18 --data-dir ~/data

Config, later overriding earlier: the defaults (presets.py: Config) < --preset < --config FILE (YAML/JSON) <
$ORCH_PARAMS_JSON (set by orch for each run) < command-line flags. Output goes to --out (default
$ORCH_RUN_DIR): config.json, metrics.jsonl, summary.json and ckpt/<step>/ with MANIFEST.json.
SIGUSR1 checkpoints at once and goes on; SIGTERM checkpoints and exits with 143.
"""


def build_parser(defaults: dict[str, Any], presets: dict[str, Any]) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m trainer", description=USAGE, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--preset", choices=sorted(presets), help="a named recipe (applied before the other options)")
    p.add_argument("--config", help="a YAML or JSON file of options")
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    from .validate import CHOICES, option_help

    helps = option_help((Path(__file__).with_name("presets.py")).read_text())
    for key, default in defaults.items():
        kind = _parse_bool if isinstance(default, bool) else type(default)
        choices = [c for c in CHOICES.get(key, ()) if c]
        meta = "{" + ",".join(choices) + "}" if choices else type(default).__name__.upper()
        # choices are checked after every source is merged (a preset, a file, $ORCH_PARAMS_JSON): see validate.py
        p.add_argument(
            f"--{key.replace('_', '-')}",
            dest=key,
            type=kind,
            default=None,
            metavar=meta,
            help=f"{helps.get(key, '')} (default: {default!r})".replace("%", "%%"),
        )
    return p


def resolve_config(defaults: dict[str, Any], presets: dict[str, Any], argv: list[str]) -> Config | None:
    """The run's Config from every source, checked (a bad option: one line, exit 2); None after --print-config."""
    args = build_parser(defaults, presets).parse_args(argv)
    flags = {k: v for k, v in vars(args).items() if k in defaults and v is not None}
    env = _mapping(_parse_json(os.environ.get("ORCH_PARAMS_JSON") or "{}", "ORCH_PARAMS_JSON"), "ORCH_PARAMS_JSON")
    file_cfg = _read_file(args.config) if args.config else {}
    preset = args.preset or env.get("preset") or file_cfg.get("preset")
    if preset is not None and preset not in presets:
        refuse(f"unknown preset {preset!r}; choose one of {', '.join(sorted(presets))}")
    cfg = dict(defaults)
    if preset:
        cfg.update(presets[preset])
    _merge(cfg, file_cfg, defaults, args.config or "")
    _merge(cfg, env, defaults, "ORCH_PARAMS_JSON")
    cfg.update(flags)
    cfg["preset"] = preset or ""
    from .validate import check_config

    explicit = set(flags) | {k.replace("-", "_") for k in env} | {k.replace("-", "_") for k in file_cfg}
    check_config(cfg, explicit)
    if not cfg["out"]:
        cfg["out"] = os.environ.get("ORCH_RUN_DIR") or "runs/trainer"
    if args.print_config:
        print(json.dumps(cfg, indent=2))
        return None
    return Config(**cfg)
