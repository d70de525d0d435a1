#!/usr/bin/env bash
# Build the documentation site strictly (as the test suite does), then serve it at http://127.0.0.1:8000 with
# live reload. Needs the dev extra (scripts/setup.sh dev).
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
.venv/bin/mkdocs build --strict --site-dir "${TMPDIR:-/tmp}/orch-site"
exec .venv/bin/mkdocs serve --strict --dev-addr "${ORCH_DOCS_ADDR:-127.0.0.1:8000}"
