"""`orch launch --dry-run --remote`: what the controller's instance may cost, printed before anything is bought."""

from __future__ import annotations

from tests.fakecloud import IMAGE_NAME

CONTROLLER = f"{{image: {IMAGE_NAME}, image_owner: self, python: python3, max_hours: 6}}"


def controller_line(out: str) -> str:
    [line] = [x for x in out.splitlines() if x.startswith("controller:")]
    return line


def test_a_remote_dry_run_of_short_runs_says_their_minutes_and_the_max_hours_that_ends_the_controller(
    orch, cloud, identity
):
    """Runs of 2 minutes: the controller's line said "at most 0.0 h"."""
    path = orch.sweep(cloud.sweep_yaml("dryshort", identity, "true", extra="timeout_minutes: 2", controller=CONTROLLER))
    r = orch("launch", str(path), "--dry-run", "--remote")
    assert r.code == 0, r.out + r.err
    line = controller_line(r.out)
    assert "on demand at $0.0104/h x at most 2 min while the runs last (1 wave(s)" in line, line
    assert "0.0 h" not in r.out and "aws.controller.max_hours (6 h) ends it: $0.0624 at the most" in line, line


def test_a_search_sweeps_remote_dry_run_counts_its_trials_times_seeds_in_waves(orch, cloud, identity):
    extra = "seeds: 2\nmax_parallel: 3\nsearch:\n  trials: 3\n  metric: loss\n  space:\n    lr: {low: 0.1, high: 1.0}\n"
    yaml = cloud.sweep_yaml("drysearch", identity, "echo {lr}", extra=extra, controller=CONTROLLER)
    r = orch("launch", str(orch.sweep(yaml)), "--dry-run", "--remote")
    assert r.code == 0, r.out + r.err
    # 3 trials x 2 seeds = 6 runs, 3 at a time: 2 waves of at most 60 min
    assert "at most 2 h while the runs last (2 wave(s)" in controller_line(r.out), r.out
