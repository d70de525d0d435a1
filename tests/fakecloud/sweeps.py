"""Sweeps for the fake cloud: experiments/fakecloud-smoke.yaml as the README runs it, with changes."""

from __future__ import annotations

import os

import yaml

from tests.conftest import ROOT
from tests.fakecloud import BUCKET


def smoke(orch, identity, name, **changes):
    """experiments/fakecloud-smoke.yaml as the README runs it (python: auto, instance_profile: create)."""
    spec = yaml.safe_load((ROOT / "experiments" / "fakecloud-smoke.yaml").read_text())
    spec.update(name=name, store=f"s3://{BUCKET}/sweeps")
    spec["aws"]["ssh"].update(identity=str(identity), user=os.environ.get("USER") or "root")
    for k, v in changes.items():
        (spec["aws"] if k.startswith("aws_") else spec)[k.removeprefix("aws_")] = v
    return orch.sweep(yaml.safe_dump(spec), name=f"{name}.yaml")
