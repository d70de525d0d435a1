"""The ssh backend (`backend: ssh`): machines the user already has, reached over SSH with pinned host keys.

`settings` its section of sweep.yaml and checks; `link` the controller's connection to a host (and the host's way
back to the store over it); `server` the store as served to the hosts; `probe` what a host has; `backend` the
Backend itself. Host side: store/tunneled.py (the agent's store) and the rest of host/, as on every backend.
"""
