"""`orch launch --remote` with public addresses: the controller's /32 is added to the sweep's security group of its
home region and of every listed region, where its hosts may be launched (its own role may change no group)."""

from __future__ import annotations

from orchestrator.backends.aws.cloud import groups
from tests.e2e.aws.test_regions import WEST, with_regions
from tests.fakecloud import REGION

HOME = "eu-west-1"


def test_the_controllers_address_is_admitted_in_its_home_region_and_every_listed_one(tmp_path, orch, identity):
    from orchestrator.backends.aws.backend import AwsBackend
    from orchestrator.backends.aws.remote import admit_controller
    from orchestrator.backends.registry import load_sweep
    from tests.fakecloud import FakeCloud

    with FakeCloud(tmp_path / "cloud", regions=(REGION, WEST, HOME), bucket_region=HOME) as cloud:
        path = orch.sweep(with_regions(cloud.sweep_yaml("adm", identity, "true"), f"[{REGION}, {WEST}]"))
        backend = AwsBackend(load_sweep(path))
        try:
            backend.preflight()  # every listed region's group and template, as `orch launch --remote` makes them
            home = cloud.client("ec2", HOME)
            home_sg = groups.ensure_security_group(home, "adm", cloud.vpcs[HOME], "127.0.0.1/32")
            admit_controller(backend.state, HOME, home_sg, "198.51.100.7/32", "i-0000000000000000a")
            for region in (REGION, WEST, HOME):
                ec2 = cloud.client("ec2", region)
                [sg] = ec2.describe_security_groups(Filters=[{"Name": "tag:orch:sweep", "Values": ["adm"]}])[
                    "SecurityGroups"
                ]
                rules = groups.controller_rules(ec2, sg["GroupId"])
                assert [r["CidrIp"] for r in rules] == ["198.51.100.7/32"], (region, rules)
        finally:
            backend.teardown()
        assert not cloud.all_leftovers(), cloud.all_leftovers()
