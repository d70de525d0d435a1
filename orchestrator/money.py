"""How orch writes dollars for people: one rule for the CLI, the controller's messages and each backend's words."""

from __future__ import annotations

from decimal import ROUND_CEILING, Decimal


def usd(amount: float, *, at_most: bool = False) -> str:
    """Dollars as a person reads them: cents from $1 up, hundredths of a cent below (a short run costs a fraction of a
    cent). `at_most`: the amount is an upper bound, so it is rounded up at that precision (a bound rounded to the
    nearest can print below what it bounds: 3 x 15 min at $0.4702/h is $0.35265, "at most $0.3526" is false)."""
    if not at_most:
        return f"${amount:.2f}" if abs(amount) >= 1 else f"${amount:.4f}"
    places = Decimal("0.01") if abs(amount) >= 1 else Decimal("0.0001")
    # through ten decimals first: float noise (0.1 * 3 = 0.30000000000000004) is no hundredth of a cent to round up to
    return f"${Decimal(f'{amount:.10f}').quantize(places, rounding=ROUND_CEILING)}"
