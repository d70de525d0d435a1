"""The value types every section of sweep.yaml is built from (spec.py and search.py share them)."""

from __future__ import annotations

import re
from typing import Annotated, Any, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

Scalar = Union[StrictBool, StrictInt, StrictFloat, StrictStr]  # noqa: UP007 (a runtime alias of Annotated types)


def _no_bool(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError("true/false is not a number")
    return value


# Counts are whole numbers and never true/false; amounts are finite numbers (no .inf, no .nan). Neither is ever
# text: `value: "0.9"` is refused like `max_parallel: "2"`, since a quoted number is more likely a mistake than meant.
Count = Annotated[StrictInt, BeforeValidator(_no_bool)]
Amount = Annotated[float, BeforeValidator(_no_bool), Field(strict=True, allow_inf_nan=False)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")  # a param name: a placeholder, an environment-safe key
