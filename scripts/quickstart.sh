#!/usr/bin/env bash
# README command 1: set up, run the local smoke sweep with a live table, collect its results.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh trainer
export PATH="$PWD/.venv/bin:$PATH"
orch launch experiments/local-smoke.yaml
orch collect local-smoke --out results/local-smoke
echo "quickstart done: results in results/local-smoke (runs.csv, runs.json, curves.png)"
