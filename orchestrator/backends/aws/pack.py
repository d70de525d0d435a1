"""Packing on aws: runs that use fewer GPUs than an instance has share it (orchestrator/sweep/packing.py).

A packed instance carries `orch:slots` (how many runs it holds) and one `orch:slot:<k>` tag per
run on it (`<run>#<attempt>`), so list() finds every run's host in the same one DescribeInstances.
A run goes to the fullest live instance with a free slot; the slot is claimed on the host itself
(host_slots.CLAIM, under the lock the agents leave their slots under), so it is never placed on
an instance whose last run is just terminating it; without a free slot, a new instance of the
best type (packing.rank) is acquired with the run in slot 0. Each agent gives its slot back when
its run ends, and the last one terminates the instance.

The Packer starts the run's agent and settles a failed placement through the Provisioner (provision.py); the
placements in flight (reserved, fresh, dead) are the ProvisioningState's, under its pack_lock.
"""

from __future__ import annotations

import logging
import shlex
import time

from orchestrator import contract
from orchestrator.backends.aws import boot
from orchestrator.backends.aws.cloud import ec2 as api
from orchestrator.backends.aws.cloud import fleet
from orchestrator.backends.aws.cloud.userdata import cloud_config
from orchestrator.backends.aws.listing import live_instance
from orchestrator.backends.aws.provision import Provisioner, first_region_with_capacity
from orchestrator.backends.aws.setup import bootstrap
from orchestrator.backends.aws.state import ProvisioningState
from orchestrator.backends.base import Host
from orchestrator.contract import RunTask
from orchestrator.errors import OrchError
from orchestrator.host.aws.slots import CLAIM, slot_run, slot_value
from orchestrator.remote.ssh import Target, authorized_keys, connect, new_host_key
from orchestrator.store.lifecycle import StopReason
from orchestrator.sweep.packing import SLOT_TAG, SLOTS_TAG, packed_gpus, visible_devices

log = logging.getLogger("orch.aws")
FRESH_S = 60.0  # how long an instance this controller just acquired counts even before a filtered describe lists it


def lives_long_enough(max_minutes: int, timeout_minutes: float | None, launched_at: float, now: float) -> bool:
    """Every instance powers itself off `aws.max_minutes` after boot. A new run goes only where that leaves it
    its `timeout_minutes` (+5 min to sync), or, without one, at least half of an instance's life."""
    left = launched_at + max_minutes * 60 - now
    return left >= (timeout_minutes * 60 + 300 if timeout_minutes else max_minutes * 30)


class Packer:
    """Places runs on shared instances and gives their slots back; starts their agents and settles their failures
    through the Provisioner, sharing only the ProvisioningState."""

    def __init__(self, state: ProvisioningState, provisioner: Provisioner):
        self.state = state
        self.provisioner = provisioner

    def provision(self, task: RunTask) -> None:
        """Claim a free slot on a live shared instance (or acquire a new one) and start the run's agent there."""
        st = self.state
        new_ids: list[str] = []
        claimed: tuple[str, int] | None = None
        reported = True
        value = slot_value(task.run_id, task.attempt)
        try:
            if st.fatal is not None:
                raise st.fatal
            setup = bootstrap(st)
            if task.replaces:
                self.provisioner.block_reclaimed(task.replaces)
            for _ in range(5):  # an instance whose last run is just leaving is skipped
                with st.pack_lock:
                    found = self._free_slot(st.markets_for(task.run_id))
                    if found is None:
                        found = self._acquire(task, setup, value)
                        new_ids = [found[0]]
                    iid, slot, host_key = found
                    st.reserved.setdefault(iid, set()).add(slot)
                claimed = (iid, slot)
                if self._start_in_slot(task, iid, slot, host_key, value, tag=not new_ids):
                    reported = False
                    return
                claimed = None
                self._unreserve(iid, slot)
            raise fleet.CapacityUnavailable("every instance with a free slot was ending; will retry")
        except Exception as exc:
            failed = not isinstance(exc, (fleet.CapacityUnavailable, api.AwsFatal))
            if claimed and new_ids and self._joined(*claimed):  # runs came to the instance it bought: it stays theirs
                failed, new_ids = True, []
            if failed and claimed and not new_ids:  # a slot on another run's instance: give it back
                self.free_claim(claimed[0], claimed[1], value)
            self.provisioner.settle(task, exc, new_ids)  # as for a run of its own
        finally:
            if claimed:
                self._unreserve(*claimed)
            if not reported:
                st.provisioned(task.run_id)

    def _start_in_slot(self, task: RunTask, iid: str, slot: int, host_key: str, value: str, tag: bool) -> bool:
        """Claim the slot on the host and start the run's agent there; False when the host refused the claim."""
        cfg = self.state.cfg
        ec2 = self.state.ec2_of(iid)
        address = boot.running_address(ec2, iid, cfg.ssh.address, cfg.boot_timeout_s)
        target = Target(address, cfg.ssh.port, cfg.ssh.user, cfg.ssh.identity, host_key)
        conn = boot.ssh_to(ec2, iid, target, cfg.boot_timeout_s)
        try:
            code = conn.run(f"bash -c {shlex.quote(CLAIM)} claim {slot} {shlex.quote(value)}").code
            if code in (3, 4):
                log.info(
                    "%s: slot %s of %s is not free (%s); looking again",
                    task.run_id,
                    slot,
                    iid,
                    "the instance is terminating" if code == 3 else "taken",
                )
                if code == 3:
                    with self.state.pack_lock:
                        self.state.dead.add(iid)
                return False
            if code != 0:
                raise OrchError(f"claiming slot {slot} on {iid} failed (exit {code})")
            if tag:
                self._tag_slot(iid, slot, value)
            devices = visible_devices(slot, packed_gpus(self.state.sweep.spec.resources))
            self.provisioner.start_agents([conn], task, [iid], slot, {"CUDA_VISIBLE_DEVICES": devices})
            log.info("%s: slot %s of %s (CUDA_VISIBLE_DEVICES=%s)", task.run_id, slot, iid, devices)
            return True
        finally:
            conn.close()

    def _free_slot(self, markets: list[str]) -> tuple[str, int, str] | None:
        """(instance, slot, host key) of a free slot on the fullest live packed instance, or None (under pack_lock).
        A run whose only market is on-demand (the deadline needs it there) takes no slot of a spot instance; any other
        run may take a slot of an on-demand one (its hours are paid for already)."""
        st = self.state
        with st.ledger.lock:
            bought = {iid: e.get("market") for iid, e in st.ledger.entries.items() if isinstance(e, dict)}
        spot_too = markets != ["on-demand"]
        live = {i["instance_id"]: i for i in st.live() if i["slot_count"]}
        now = time.time()
        for iid in [i for i in st.fresh if i in live or now - st.fresh[i][2] > FRESH_S]:
            del st.fresh[iid]  # listed now (or gone): the listing speaks for it
        view = {
            iid: (i["slot_count"], set(i["slots"]), i["host_key"], i["launch_time"] or now) for iid, i in live.items()
        }
        view.update({iid: (n, set(), key, born) for iid, (n, key, born) in st.fresh.items()})
        best = None
        for iid, (n, used, key, born) in view.items():
            taken = used | st.reserved.get(iid, set())
            free = [k for k in range(n) if k not in taken]
            if not lives_long_enough(st.cfg.max_minutes, st.sweep.spec.timeout_minutes, born, now):
                continue  # its safety-net shutdown would cut the run short: a fresh instance instead
            if not (spot_too or bought.get(iid) == "on-demand"):
                continue  # a spot slot for a run the deadline needs on on-demand
            if iid not in st.dead and free and (best is None or len(taken) > best[3]):
                best = (iid, free[0], key, len(taken))
        return best[:3] if best else None

    def _acquire(self, task: RunTask, setup: dict, value: str) -> tuple[str, int, str]:
        """A new instance of the best type that has capacity, with this run in slot 0 (under pack_lock): the sweep's
        regions in its order, as single runs ask them (provision.acquire_anywhere): a region where no type has
        capacity (or its image is still being copied there, or its quota is reached) hands over to the next one in
        the same pass. `setup`: the first region's."""
        st, cfg = self.state, self.state.cfg
        host_private, host_public = new_host_key()
        user_data = cloud_config(host_private, host_public, authorized_keys(cfg.ssh.identity), cfg.max_minutes)
        region, (got, slots) = first_region_with_capacity(
            cfg.regions,
            lambda r: self._acquire_in(
                r, setup if r == cfg.regions[0] else bootstrap(st, r), user_data, host_public, value, task.run_id
            ),
        )
        st.where[got.instance_id] = region
        st.ledger.acquired(
            got.instance_id,
            got.instance_type,
            got.az,
            got.market,
            gpus=self.provisioner.gpus_of(got.instance_type),
            slots=slots,
        )
        st.fresh[got.instance_id] = (slots, host_public, time.time())
        log.info(
            "%s: new shared instance %s %s in %s (%s), %s slots",
            task.run_id,
            got.instance_id,
            got.instance_type,
            got.az,
            got.market,
            slots,
        )
        return got.instance_id, 0, host_public

    def _acquire_in(self, region: str, setup: dict, user_data: str, host_public: str, value: str, run_id: str):
        """(instance, its slots) of the best type with capacity in `region`, in the order that region's own spot
        prices rank them (setup's pack_order); the last type's refusal when none has any."""
        st = self.state
        last: Exception | None = None
        for choice in setup["pack_order"]:
            pools = [c for c in setup["choices"] if c.instance_type == choice.instance_type]
            tags = api.sweep_tags(st.name, hostkey=host_public) + [
                {"Key": SLOTS_TAG, "Value": str(choice.slots)},
                {"Key": f"{SLOT_TAG}0", "Value": value},
                {"Key": "Name", "Value": f"orch {st.name} shared ({choice.slots} runs)"},
            ]
            base = (setup["template"], setup["base"], user_data, pools, st.markets_for(run_id), tags)
            try:
                return fleet.acquire(st.part(region).ec2, *base, st.blocklist), choice.slots
            except fleet.CapacityUnavailable as exc:
                last = exc
        raise last or fleet.CapacityUnavailable("no instance type can hold this run")

    def _tag_slot(self, iid: str, slot: int, value: str) -> None:
        from botocore.exceptions import ClientError

        from orchestrator.wait import retry_until

        def once() -> bool:
            try:
                self.state.ec2_of(iid).create_tags(Resources=[iid], Tags=[{"Key": f"{SLOT_TAG}{slot}", "Value": value}])
                return True
            except ClientError as exc:
                if api._not_found(exc):  # a new id, not visible everywhere yet
                    return False
                raise

        retry_until(once, api.NOT_FOUND_S, 1.0, f"EC2 to know {iid}")

    def _joined(self, iid: str, slot: int) -> bool:
        """Whether another run holds a slot on the instance this run acquired and failed to start on (placing, or
        placed: its tag). If none, nothing is placed there any more: the failed run's release terminates it."""
        st = self.state
        with st.pack_lock:
            if st.reserved.get(iid, set()) - {slot}:
                return True
            st.dead.add(iid)
        inst = live_instance(st, iid)
        return inst is not None and any(k != slot for k in inst["slots"])

    def _unreserve(self, iid: str, slot: int) -> None:
        with self.state.pack_lock:
            self.state.reserved.get(iid, set()).discard(slot)

    def free_claim(
        self, iid: str, slot: int, value: str, reason: StopReason = StopReason.LOST, inst: dict | None = None
    ) -> None:
        """Give a run's slot back from here: stop its session, remove its tag and its claim on the host (best effort).
        `inst`: the instance as just listed, when the caller has it (else it is looked up)."""
        from orchestrator.host.aws.slots import SLOTS_DIR

        st = self.state
        inst = inst or live_instance(st, iid)
        run_id = slot_run(value)
        try:
            if inst is not None:
                conn = connect(st.target(inst), timeout=20)
                try:
                    conn.run(
                        contract.stop_script(
                            st.ctl(run_id),
                            contract.session_name(st.name, run_id),
                            reason,
                            30,
                            contract.REMOTE_TMUX_SOCKET,
                        ),
                        timeout=60,
                    )
                    conn.run(
                        f'd="$HOME/{SLOTS_DIR}"; exec 9>"$d/.lock" && flock 9 && '
                        f'if [ "$(cat "$d/slot.{slot}" 2>/dev/null)" = {shlex.quote(value)} ]; then rm -f '
                        f'"$d/slot.{slot}"; fi'
                    )
                finally:
                    conn.close()
            st.ec2_of(iid).delete_tags(Resources=[iid], Tags=[{"Key": f"{SLOT_TAG}{slot}", "Value": value}])
        except Exception as exc:  # the instance may be gone already; `orch down` removes what is left
            log.warning("could not free slot %s of %s: %s", slot, iid, exc)

    def release(self, host: Host, reason: StopReason = StopReason.LOST) -> None:
        """A run's host on a shared instance: the instance goes only with its last run."""
        inst = live_instance(self.state, host.host_id)
        if inst is None:
            return
        value = slot_value(host.run_id, host.attempt or 0)
        others = {k: v for k, v in inst["slots"].items() if k != host.slot}
        if others:
            self.free_claim(host.host_id, host.slot, value, reason, inst)
        else:
            api.terminate(self.state.ec2_of(host.host_id), [host.host_id])
