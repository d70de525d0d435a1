"""An image recipe (ami/recipe.yaml): its model and loading, with the hash that finds its image again."""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import yaml
from pydantic import Field

from orchestrator.backends.aws.settings import AwsSection
from orchestrator.errors import SpecError
from orchestrator.sweep.spec import NAME_RE
from orchestrator.sweep.spec_types import Strict

log = logging.getLogger("orch.ami")


class Recipe(Strict):
    """An image recipe (docs/guides/data-and-images.md)."""

    name: str = Field(
        ..., pattern=NAME_RE, description="Recipe name; `image: recipe:NAME` in a sweep finds its newest image."
    )
    aws: AwsSection = Field(..., description="Where and from what to build: the same fields as a sweep's `aws:`.")
    steps: list[str] = Field(
        ..., min_length=1, description="Shell commands run in order on the builder (sudo available)."
    )
    files: dict[str, str] = Field(
        default_factory=dict, description="Local file (relative to the recipe) -> path on the builder."
    )
    smoke: str = Field("", description="A command that must exit 0 on the builder before the image is taken.")


def load_recipe(path: Path) -> tuple:
    """(Recipe, sha): the sha covers the recipe's text and every file it copies."""
    from pydantic import ValidationError

    from orchestrator.sweep.yaml_errors import Loader, format_errors

    path = Path(path)
    if not path.is_file():
        raise SpecError(f"{path}: recipe not found. The default is ami/recipe.yaml.")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(f"{path}: not UTF-8 text (byte {exc.start}); a recipe is YAML. Save it as UTF-8.") from None
    except OSError as exc:
        raise SpecError(f"{path}: cannot read the recipe: {exc.strerror}") from None
    try:
        root, data = yaml.compose(text, Loader=Loader), yaml.load(text, Loader=Loader)
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: invalid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise SpecError(f"{path}:1: a recipe is a mapping with name:, aws:, steps: (see ami/recipe.yaml)")
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as exc:
        raise SpecError("\n".join(format_errors(exc, path, root, Recipe))) from None
    h = hashlib.sha256(text.encode())
    for local in sorted(recipe.files):
        f = (path.parent / local).expanduser()
        if not f.is_file():
            raise SpecError(f"{path}: files: {local} not found (paths are relative to the recipe)")
        h.update(local.encode() + b"\0" + f.read_bytes())
    return recipe, h.hexdigest()
