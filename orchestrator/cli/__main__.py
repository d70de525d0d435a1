"""`python -m orchestrator.cli` is `orch` (the detached controller starts this way)."""

from orchestrator.cli.main import main

main()
