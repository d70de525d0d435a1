#!/usr/bin/env bash
# README command 2: set up (tmux, sshd, orch with trainer+dev extras) and run the whole test suite
# (benchmarks excluded; `scripts/test.sh -m bench -s` runs them). Extra arguments go to pytest, e.g. scripts/test.sh -k spec
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh trainer,dev || exit 1
export PATH="$PWD/.venv/bin:$PATH"
# Benchmarks (tests/bench, marker `bench`) are measurements, not checks: they run when asked for,
# e.g. `scripts/test.sh -m bench -s`; any -m given here replaces the default selection.
select=(-m "not bench")
for arg in "$@"; do [ "$arg" = "-m" ] && select=(); done
.venv/bin/python -m pytest tests "${select[@]}" "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "test.sh: pytest collected no tests; that is a failure" >&2
  exit 1
fi
exit "$rc"
