"""Placement groups for the fake cloud: moto has none, so the gate answers these actions itself, as
strictly as EC2 does.

- CreatePlacementGroup / DescribePlacementGroups / DeletePlacementGroup, with tags; a duplicate name
  is `InvalidPlacementGroup.Duplicate`, an unknown one `InvalidPlacementGroup.Unknown`.
- DeletePlacementGroup of a group that still holds an instance that is not `terminated` is
  `InvalidPlacementGroup.InUse` (an instance in `shutting-down` still counts).
- CreateFleet overrides naming a group that does not exist are refused (fleet Errors); a `cluster`
  group holds instances of one Availability Zone only: launching into it in another AZ while it
  holds live instances is refused too.
- A group belongs to one region, as EC2's do: each region has its own names, and a launch in one region
  cannot use a group of another (it is unknown there).
"""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class PlacementGroups:
    """The groups of the fake account, and which instance went into which."""

    state_of: Callable[[str], str | None]  # instance id -> its state name (None when unknown)
    groups: dict[tuple[str, str], dict] = field(default_factory=dict)  # (region, name) -> {"id", "strategy", "tags"}
    members: dict[str, tuple[str, str]] = field(default_factory=dict)  # instance id -> (group, AZ)

    def __post_init__(self):
        self.lock = threading.Lock()

    # --- the API ---------------------------------------------------------------------------------

    def answer(self, action: str, form: dict[str, list[str]], error: Callable[..., tuple], region: str) -> tuple:
        name = form.get("GroupName", [""])[0]
        key = (region, name)
        with self.lock:
            if action == "CreatePlacementGroup":
                if key in self.groups:
                    return error("InvalidPlacementGroup.Duplicate", f"Placement group '{name}' already exists")
                tags = _tags(form)
                group = {
                    "id": f"pg-{uuid.uuid4().hex[:17]}",
                    "strategy": form.get("Strategy", ["cluster"])[0],
                    "tags": tags,
                }
                self.groups[key] = group
                return _ok("CreatePlacementGroupResponse", f"<placementGroup>{_item(name, group)}</placementGroup>")
            if action == "DeletePlacementGroup":
                if key not in self.groups:
                    return error("InvalidPlacementGroup.Unknown", f"The Placement Group '{name}' is unknown")
                if self._live_members(key):
                    return error(
                        "InvalidPlacementGroup.InUse", f"The placement group '{name}' is in use and may not be deleted"
                    )
                del self.groups[key]
                return _ok("DeletePlacementGroupResponse", "<return>true</return>")
            names = [v[0] for k, v in form.items() if k.startswith("GroupName.")]
            wanted = _filters(form)
            items = "".join(
                f"<item>{_item(n, g)}</item>"
                for (r, n), g in self.groups.items()
                if r == region and (not names or n in names) and wanted(g["tags"])
            )
            return _ok("DescribePlacementGroupsResponse", f"<placementGroupSet>{items}</placementGroupSet>")

    # --- CreateFleet -------------------------------------------------------------------------------

    def refusal(self, group: str, az: str) -> tuple[str, str] | None:
        """Why a launch into `group` in `az` is refused, or None."""
        key = (region_of(az), group)
        with self.lock:
            if key not in self.groups:
                return "InvalidPlacementGroup.Unknown", f"The Placement Group '{group}' is unknown"
            if self.groups[key]["strategy"] == "cluster":
                zones = {z for iid, (g, z) in self.members.items() if (region_of(z), g) == key and self._live(iid)}
                if zones and az not in zones:
                    return (
                        "InvalidParameterCombination",
                        "a cluster placement group holds instances of one Availability Zone "
                        f"({', '.join(sorted(zones))}), not {az}",
                    )
        return None

    def joined(self, instance_id: str, group: str, az: str) -> None:
        with self.lock:
            self.members[instance_id] = (group, az)

    def _live_members(self, key: tuple[str, str]) -> list[str]:
        return [iid for iid, (g, z) in self.members.items() if (region_of(z), g) == key and self._live(iid)]

    def _live(self, instance_id: str) -> bool:
        return self.state_of(instance_id) not in (None, "terminated")


def region_of(az: str) -> str:
    """us-west-2a -> us-west-2."""
    return az[:-1]


def _tags(form: dict[str, list[str]]) -> dict[str, str]:
    keys = {m.group(1): v[0] for k, v in form.items() if (m := re.match(r"TagSpecification\.1\.Tag\.(\d+)\.Key$", k))}
    return {key: form.get(f"TagSpecification.1.Tag.{n}.Value", [""])[0] for n, key in keys.items()}


def _filters(form: dict[str, list[str]]) -> Callable[[dict[str, str]], bool]:
    """`tag:KEY` and `tag-key` filters (what orch asks for); any other filter name is refused loudly."""
    tests = []
    for k, v in form.items():
        m = re.match(r"Filter\.(\d+)\.Name$", k)
        if not m:
            continue
        vals = [val[0] for kk, val in form.items() if kk.startswith(f"Filter.{m.group(1)}.Value.")]
        if v[0].startswith("tag:"):
            tests.append(lambda tags, key=v[0][4:], vals=vals: tags.get(key) in vals)
        elif v[0] == "tag-key":
            tests.append(lambda tags, vals=vals: any(x in tags for x in vals))
        else:
            raise ValueError(f"the fake cloud does not filter placement groups by {v[0]}")
    return lambda tags: all(t(tags) for t in tests)


def _item(name: str, group: dict) -> str:
    tags = "".join(f"<item><key>{k}</key><value>{v}</value></item>" for k, v in group["tags"].items())
    return (
        f"<groupName>{name}</groupName><groupId>{group['id']}</groupId><state>available</state>"
        f"<strategy>{group['strategy']}</strategy><tagSet>{tags}</tagSet>"
    )


def _ok(root: str, body: str) -> tuple:
    xml = (
        f'<?xml version="1.0" encoding="UTF-8"?><{root} xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">'
        f"<requestId>{uuid.uuid4()}</requestId>{body}</{root}>"
    )
    return "200 OK", [("Content-Type", "text/xml")], xml.encode()
