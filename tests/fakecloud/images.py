"""Images for the fake cloud, where moto is kinder than EC2 (the gate hands these actions here first).

- CreateImage / CopyImage answer at once; the image is `pending` for `image_s`, then ends in `end_state`
  (`available`, or any other ImageState a test sets: `failed`, `error`, `invalid`, `disabled` ... with a
  StateReason) (EC2 user guide, *Create an Amazon EBS-backed AMI*). moto makes it `available` at once.
- A new image id is eventually consistent: DescribeImages and CreateTags by that id answer
  `InvalidAMIID.NotFound` for `instance_s` (EC2 API reference, *Eventual consistency*).
- TagSpecifications of CreateImage / CopyImage tag the image and its snapshots "on creation" (botocore's
  EC2 model); moto refuses snapshot tags (NotImplementedError) and ignores CopyImage's, so they are applied here.
- CreateImage snapshots the instance's volume and CopyImage copies the source's: `snapshot(new image, instance or
  source image)`, set by the fake cloud, keeps the builder's home for the instances launched from the image.
- DeregisterImage: "Recently deregistered images appear in the returned results for a short interval"
  (DescribeImages): the image stays listed as `deregistered` for `deregistered_s`; deregistering it again is
  `InvalidAMIID.Unavailable`. `DeleteAssociatedSnapshots=true` deletes its snapshots (moto ignores it).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlencode


@dataclass
class Images:
    gate: object  # the Gate: forward(), _ec2_error(), _born(), _is_young(), strict, fail_images
    end_state: str = "available"  # set by a test: the ImageState new images end in
    deregistered_s: float = 3.0  # a deregistered image is listed (as `deregistered`) this long
    snapshot: Callable[[str, str], None] | None = None  # (new image id, the instance or image it was made from)

    def answer(self, action: str, form: dict[str, list[str]], environ, body: bytes) -> tuple | None:
        """The answer to an image action, or None for the gate to forward it to moto as it is."""
        if action in ("DescribeImages", "CreateTags"):
            ids = [v[0] for k, v in form.items() if re.match(r"(ImageId|ResourceId)\.\d+$", k)]
            young = [i for i in ids if i.startswith("ami-") and self.gate._is_young(i, self.gate.strict.instance_s)]
            if young:
                return self.gate._ec2_error("InvalidAMIID.NotFound", f"The image id '[{young[0]}]' does not exist")
            return None
        if action in ("CreateImage", "CopyImage"):
            return self._create(environ, body)
        return self._deregister(environ, form)

    def _create(self, environ, body: bytes) -> tuple:
        pairs = parse_qsl(body.decode(), keep_blank_values=True)
        specs: dict[str, dict] = {}  # TagSpecification.N -> {"type", "tags"}
        for k, v in pairs:
            m = re.match(r"TagSpecification\.(\d+)\.(ResourceType|Tag\.(\d+)\.(Key|Value))$", k)
            if m:
                spec = specs.setdefault(m.group(1), {"type": "", "tags": {}})
                if m.group(2) == "ResourceType":
                    spec["type"] = v
                else:
                    spec["tags"].setdefault(m.group(3), {})[m.group(4)] = v
        kept = [(k, v) for k, v in pairs if not k.startswith("TagSpecification.")]
        answer = self.gate.forward(environ, urlencode(kept).encode())
        if not answer[0].startswith("200"):
            return answer
        source = dict(pairs).get("InstanceId") or dict(pairs).get("SourceImageId", "")
        for image_id in set(re.findall(rb"ami-[0-9a-f]+", answer[2])):
            if self.snapshot is not None and image_id.decode() != source:
                self.snapshot(image_id.decode(), source)  # the volume as it is now (EC2 reboots the builder first)
            self._made(image_id.decode(), specs)
        return answer

    def _made(self, image_id: str, specs: dict[str, dict]) -> None:
        from tests.fakecloud.gate import MOTO, _ec2_backend

        self.gate._born(image_id)
        with MOTO:
            backend = _ec2_backend()
            image = backend.amis.get(image_id)
            if image is None:
                return
            for spec in specs.values():
                tags = {t["Key"]: t.get("Value", "") for t in spec["tags"].values() if "Key" in t}
                targets = [image_id] if spec["type"] == "image" else _snapshots(image)
                if tags and targets:
                    backend.create_tags(targets, tags)
        self._pending(image)

    def _pending(self, image) -> None:
        from tests.fakecloud.gate import MOTO, _later

        if self.gate.strict.image_s <= 0:
            return
        with MOTO:
            image.state = "pending"
        end = "failed" if self.gate.fail_images else self.end_state

        def done():
            with MOTO:
                image.state = end
                if end != "available":
                    image.state_reason = {
                        "Code": "Client.InternalError",
                        "Message": f"injected by the fake cloud: the image ended {end}",
                    }

        _later(self.gate.strict.image_s, done)

    def _deregister(self, environ, form: dict[str, list[str]]) -> tuple:
        from tests.fakecloud.gate import MOTO, _ec2_backend, _later

        image_id = form.get("ImageId", [""])[0]
        with MOTO:
            backend = _ec2_backend()
            image = backend.amis.get(image_id)
            if image is not None and image.state == "deregistered":
                return self.gate._ec2_error(
                    "InvalidAMIID.Unavailable", f"The image '{image_id}' is no longer available"
                )
            answer = self.gate.forward(environ)
            if image is None or not answer[0].startswith("200"):
                return answer
            if form.get("DeleteAssociatedSnapshots", ["false"])[0].lower() == "true":
                for snap in _snapshots(image):
                    backend.snapshots.pop(snap, None)
            image.state = "deregistered"
            backend.amis[image_id] = image  # still listed for a short interval

        def forget():
            with MOTO:
                if backend.amis.get(image_id) is image:
                    backend.amis.pop(image_id)

        _later(self.deregistered_s, forget)
        return answer


def _snapshots(image) -> list[str]:
    snap = getattr(image, "ebs_snapshot", None)
    return [snap.id] if snap is not None else []
