"""How orch writes dollars for people: one rule for the CLI, the controller's messages and each backend's words."""

from __future__ import annotations


def usd(amount: float) -> str:
    """Dollars as a person reads them: cents from $1 up, hundredths of a cent below (a short run costs a fraction of a
    cent)."""
    return f"${amount:.2f}" if abs(amount) >= 1 else f"${amount:.4f}"
