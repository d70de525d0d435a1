#!/usr/bin/env bash
# Provisions an orch image from the AWS Deep Learning AMI (PyTorch, Ubuntu); run by `orch ami build`
# as the image's ssh user (sudo available), with orch's code on PYTHONPATH.
# Installs: tmux (the agent runs each attempt in a tmux session), boto3/PyYAML into the framework's
# interpreter (the agent's needs), and CIFAR-10 in /data/cifar10 (the trainer's --data-dir), so a
# run on the image starts without touching the internet.
set -euo pipefail

PY=/opt/pytorch/bin/python
if [ ! -x "$PY" ]; then
  PY=$(command -v python3)
fi

if ! command -v tmux >/dev/null 2>&1; then
  sudo apt-get update -q
  sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -q tmux
fi

"$PY" -m pip install --quiet --upgrade boto3 pyyaml

sudo mkdir -p /data/cifar10
sudo chown "$(id -u):$(id -g)" /data/cifar10
"$PY" -c 'from trainer.data import load_cifar10; d = load_cifar10("/data/cifar10"); print("cifar10:", len(d.train), "train,", len(d.test), "test")'

# What the image holds, for `orch ami list` readers and for debugging.
{
  echo "built by orch ami: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "python: $PY ($("$PY" -c 'import torch; print("torch", torch.__version__)'))"
  echo "tmux: $(tmux -V)"
} | sudo tee /etc/orch-image >/dev/null
