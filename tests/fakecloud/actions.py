"""moto's answer to "is this action a method of the service's responses class", remembered per class.

moto asks it for every request by listing the class's members (`inspect.getmembers`, hundreds of attributes for
EC2), about 3% of an xdist worker's CPU in the AWS tests (py-spy). A class's functions do not change while the
tests run, so the list is made once per class; what moto does with it is unchanged."""

from __future__ import annotations

import functools

from tests.fakecloud import amis  # noqa: F401  (MOTO_AMIS_PATH set before any of moto loads)


def remember_action_names() -> None:
    """moto's `method_names_from_class`, as its responses module calls it, cached per class."""
    from moto.core import responses

    if not hasattr(responses.method_names_from_class, "cache_info"):
        responses.method_names_from_class = functools.cache(responses.method_names_from_class)


remember_action_names()  # on import: tests/fakecloud/__init__.py imports this module before any of moto's is used
