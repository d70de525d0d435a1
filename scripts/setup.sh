#!/usr/bin/env bash
# Shared setup: system packages when missing (tmux; for the tests sshd, Slurm and munge), a virtualenv in .venv, orch installed with extras.
# Usage: scripts/setup.sh [EXTRAS]   (default: trainer)
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-trainer}"

need=()
command -v tmux >/dev/null 2>&1 || need+=(tmux)
if [[ ",$extras," == *",dev,"* || ",$extras," == *",fakecloud,"* ]]; then  # the fake cloud's hosts are sshd
  command -v sshd >/dev/null 2>&1 || [ -x /usr/sbin/sshd ] || need+=(openssh-server)
fi
if [[ ",$extras," == *",dev,"* ]]; then  # the slurm backend's tests run a real slurmctld, slurmd and munged
  command -v slurmctld >/dev/null 2>&1 || [ -x /usr/sbin/slurmctld ] || need+=(slurm-wlm)
  command -v munged >/dev/null 2>&1 || [ -x /usr/sbin/munged ] || need+=(munge)
fi
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]} with apt-get"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${need[@]}" >/dev/null
fi

# The browser tests (`orch tensorboard`, the docs site's search box) use Debian's chromium, and chromium-driver
# for the one that types into a page; where they cannot be installed, those tests skip and say why.
browser=()
if [[ ",$extras," == *",dev,"* ]]; then
  command -v chromium >/dev/null 2>&1 || browser+=(chromium)
  command -v chromedriver >/dev/null 2>&1 || browser+=(chromium-driver)
fi
if [ ${#browser[@]} -gt 0 ]; then
  echo "setup: installing ${browser[*]} with apt-get (for the browser tests)"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  { $sudo_cmd apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${browser[@]}" >/dev/null; } \
    || echo "setup: ${browser[*]} could not be installed; the browser tests will skip" >&2
fi

python="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $($python --version)"
  "$python" -m venv .venv
fi
# Reinstall only when the project's dependencies changed (pip is slow to say "already satisfied").
stamp=".venv/.orch-installed-$extras"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "setup: installing orch[$extras] into .venv (the first time takes a few minutes: PyTorch)"
  .venv/bin/python -m pip install -q --disable-pip-version-check -e ".[$extras]" 2>&1 | grep -v "^WARNING: Location" || true
  .venv/bin/python -c "import orchestrator, trainer" || { echo "setup: install failed" >&2; exit 1; }
  touch "$stamp"
fi
