"""The fake cloud (moto + sshd hosts on loopback), a package of its own: cloud.py the FakeCloud and its hosts,
gate.py the gate in front of moto (IAM, eventual consistency, injected errors), images.py and placement.py what
moto leaves out. Tests import its names from here: `from tests.fakecloud import BUCKET, FakeCloud`."""

# first, before moto's EC2 models load: MOTO_AMIS_PATH (amis.py says why), then moto's action lookup kept per class
# (actions.py; it imports amis first itself). isort keeps them first: "actions", "amis" < "cloud".
from tests.fakecloud import actions, amis  # noqa: F401
from tests.fakecloud.cloud import BUCKET, IMAGE_NAME, REGION, FakeCloud, main, processes_of
from tests.fakecloud.gate import Strictness

__all__ = ["BUCKET", "IMAGE_NAME", "REGION", "FakeCloud", "Strictness", "main", "processes_of"]
