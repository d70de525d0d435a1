#!/usr/bin/env bash
# README command 2: set up (tmux, sshd, Slurm + munge, orch with trainer+dev extras) and run the whole test suite
# (benchmarks excluded; `scripts/test.sh -m bench -s` runs them). Extra arguments go to pytest, e.g. scripts/test.sh -k spec
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
scripts/setup.sh trainer,dev || exit 1
export PATH="$PWD/.venv/bin:$PATH"
# Where the environment sets PYTHONDONTWRITEBYTECODE (these machines do), Python writes no .pyc, so every process the
# suite starts (each CLI call, controller, agent, fake host) compiled orch's sources again: about 0.2 s of CPU per
# `orch status` of an aws sweep (1.32 s -> 1.13 s measured). Compile them once here; imports still read them.
.venv/bin/python -m compileall -q orchestrator trainer tests >/dev/null || exit 1
# Benchmarks (tests/bench, marker `bench`) are measurements, not checks: they run when asked for,
# e.g. `scripts/test.sh -m bench -s`; any -m given here replaces the default selection.
# A -m that names no benchmark keeps them out too: `-m "not slow"` (the fast loop) runs "(not slow) and not bench".
select=(-m "not bench")
args=()
expr_next=0
for arg in "$@"; do
  if [ "$expr_next" = 1 ]; then
    expr_next=0
    select=()
    [[ "$arg" != *bench* ]] && arg="($arg) and not bench"
  fi
  [ "$arg" = "-m" ] && expr_next=1
  args+=("$arg")
done
set -- "${args[@]}"
# Four workers (pytest-xdist) on the two cores: many tests wait on fake boots, leases and passes; with three the
# cores were idle 17% of the suite (2,696 CPU s in 1,620 s), so a fourth worker fills them. Tests go out one at a time (--maxschedchunk 1), longest first (tests/conftest.py):
# xdist's default hands each worker a block of consecutive tests, which gave the first worker every long test.
# Each fake cloud takes a loopback /16 of its own (tests/fakecloud/cloud.py), so two at once never share an address.
# ORCH_TEST_WORKERS=0 runs everything in this process; benchmarks always do (a measurement must not share the
# machine).
workers="${ORCH_TEST_WORKERS:-4}"
for arg in "$@"; do [[ "$arg" == *bench* && "$arg" != *"not bench"* ]] && workers=0; done
parallel=()
[ "$workers" -gt 0 ] && parallel=(-n "$workers" --maxschedchunk 1)
.venv/bin/python -m pytest tests "${select[@]}" "${parallel[@]}" "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "test.sh: pytest collected no tests; that is a failure" >&2
  exit 1
fi
exit "$rc"
