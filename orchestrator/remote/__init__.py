"""How the controller runs commands on a host: the Runner base and its local subclass (`runners`), and an
SSH connection with a pinned host key (`ssh`, the only module that speaks SSH).

Imports only `orchestrator.errors` and `orchestrator.wait`.
"""
