"""How the cost modules write an amount of US dollars."""

from __future__ import annotations


def usd(value: float | None) -> str:
    """Format a USD amount: cents above $1, more digits below (tiny test jobs cost fractions of a cent)."""
    if value is None:
        return "n/a"
    if value == 0:
        return "$0"  # nothing billed (every row carried): "$0.000000" reads like a rounding
    if abs(value) >= 1:
        return f"${value:,.2f}"
    return f"${value:.4f}" if abs(value) >= 0.0001 else f"${value:.6f}"
