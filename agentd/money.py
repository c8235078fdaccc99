"""Money as people read it."""

from __future__ import annotations

import math


def format_usd(amount: float) -> str:
    """Dollars with enough digits to show small amounts: $12.34, $0.50, $0.0010, $0.000012."""
    if amount <= 0 or amount >= 1:
        return f"${amount:.2f}"
    # Two significant digits below a dollar, so a $0.001 limit never reads as $0.00.
    decimals = min(10, max(2, -math.floor(math.log10(amount)) + 1))
    return f"${amount:.{decimals}f}"
