"""The fake cloud (moto + sshd hosts on loopback), a package of its own: cloud.py the FakeCloud and its hosts,
gate.py the gate in front of moto (IAM, eventual consistency, injected errors), images.py and placement.py what
moto leaves out. Tests import its names from here: `from tests.fakecloud import BUCKET, FakeCloud`."""

# first: moto's EC2 models read MOTO_AMIS_PATH as they load (amis.py says why it is set on import)
from tests.fakecloud import amis  # noqa: F401  (isort keeps it first: "amis" < "cloud")
from tests.fakecloud.cloud import BUCKET, IMAGE_NAME, REGION, FakeCloud, main, processes_of
from tests.fakecloud.gate import Strictness

__all__ = ["BUCKET", "IMAGE_NAME", "REGION", "FakeCloud", "Strictness", "main", "processes_of"]
