"""The local backend (`backend: local`): each run an agent in a tmux session on this machine.

`settings` its section of sweep.yaml (`local:`) and checks; `tmux_server` the controller's side of this machine's
tmux server (libtmux); `backend` the Backend itself.
"""
