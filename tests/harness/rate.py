"""Scenarios a minute of the harness: `PYTHONPATH=. .venv/bin/python -m tests.harness.rate [bounded|long]`."""

from __future__ import annotations

import sys
import time

from hypothesis import seed, settings
from hypothesis.stateful import run_state_machine_as_test

from tests.harness import machine, test_invariants


def main() -> None:
    profile = sys.argv[1] if len(sys.argv) > 1 else "bounded"
    wall, cpu = time.time(), time.process_time()
    factory = seed(test_invariants.BOUNDED_SEED)(machine.Harness)
    run_state_machine_as_test(factory, settings=settings.get_profile(profile))
    wall, cpu = time.time() - wall, time.process_time() - cpu
    n = machine.Harness.counts
    sys.stdout.write(
        f"{n['scenarios']} scenarios, {n['steps']} steps in {wall:.1f} s ({cpu:.1f} s CPU): "
        f"{60 * n['scenarios'] / wall:.0f} scenarios a minute\n"
    )


if __name__ == "__main__":
    main()
