"""moto's EC2 images, its 44 defaults only.

moto makes an EC2 backend for each region it is asked about, and again for each after every reset (each fake cloud
resets moto as it stops). Each time it builds its 44 default images and then, per region, the latest Amazon Linux
ones and about 1,300 ECS-optimized ones: measured with py-spy, a fifth of an xdist worker's CPU in the AWS tests.
With MOTO_AMIS_PATH set, moto builds that file's images and skips the per-region ones; the file written here holds
moto's own 44 defaults, so every image a test could ask moto for by owner `amazon` is still there. orch itself never
looks for an ECS-optimized image (its images are the sweep's, a recipe's, or a Deep Learning AMI by name)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


def only_default_amis() -> None:
    """Point MOTO_AMIS_PATH at moto's own default images (written once per moto version), unless a test set it."""
    if "MOTO_AMIS_PATH" in os.environ:
        return
    from moto import __version__
    from moto.utilities.utils import load_resource

    path = Path(tempfile.gettempdir()) / f"orch-tests-moto-{__version__}-amis.json"
    if not path.exists():
        fd, partial = tempfile.mkstemp(dir=path.parent, prefix=path.name)
        with os.fdopen(fd, "w") as f:
            json.dump(load_resource("ec2/resources/amis.json"), f)
        os.replace(partial, path)  # whole or not at all: workers may write it at once
    os.environ["MOTO_AMIS_PATH"] = str(path)


only_default_amis()  # on import: tests/fakecloud/__init__.py imports this module before any of moto's
