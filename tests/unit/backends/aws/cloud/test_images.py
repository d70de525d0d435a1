"""Images (backends/aws/cloud/images.py) and the launch templates that carry them: `image:` resolved to the newest match
at each launch, the root volume named and sized by the image."""

from __future__ import annotations

import time

import pytest

from orchestrator.backends.aws.backend import AwsBackend
from orchestrator.backends.aws.cloud import ec2 as api
from orchestrator.backends.aws.cloud.images import resolve_image
from orchestrator.backends.registry import load_sweep
from tests.fakecloud import IMAGE_NAME, REGION


def test_a_relaunch_uses_todays_image_not_the_templates_first(orch, cloud, identity):
    path = orch.sweep(cloud.sweep_yaml("tpl", identity, "true"))
    first = AwsBackend(load_sweep(path))
    old = first.bootstrap()
    assert old["base"]["ImageId"] == cloud.image
    time.sleep(1.1)  # a newer CreationDate: `image:` names a pattern, resolved to the newest match
    newer = cloud.register_image(IMAGE_NAME)
    again = AwsBackend(load_sweep(path)).bootstrap()  # the sweep's launch template exists from the first launch
    assert again["template"] == old["template"]
    assert again["base"]["ImageId"] == newer  # each instance's template version carries it, not version 1's image
    assert "LaunchTemplateInstanceMetadataOptions" not in str(
        again["base"]
    )  # request fields only, never a describe answer
    first.pool.shutdown(wait=False)
    from orchestrator.backends.aws.cloud import ec2 as api
    from orchestrator.backends.aws.cloud.teardown import teardown

    teardown(api.client("ec2", "us-east-1"), api.client("iam", "us-east-1"), "tpl")  # what the two bootstraps made


@pytest.mark.slow
def test_i_root_volume_follows_the_image(cloud):
    ec2 = cloud.client("ec2")
    al = cloud.register_image("al2023-dl", root_device="/dev/xvda", snapshot_gb=75)
    image = resolve_image(ec2, al, "self", REGION)
    data = api.launch_template_data(image, "sg-1", 20, None, public_ip=False)
    assert data["BlockDeviceMappings"][0]["DeviceName"] == "/dev/xvda"
    assert data["BlockDeviceMappings"][0]["Ebs"]["VolumeSize"] == 75  # never below the snapshot
    assert (
        api.launch_template_data(image, "sg-1", 200, None, public_ip=False)["BlockDeviceMappings"][0]["Ebs"][
            "VolumeSize"
        ]
        == 200
    )
