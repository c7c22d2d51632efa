"""Money helpers: percentages, discounts, tax and formatting in integer cents."""

from __future__ import annotations

# (minimum quantity, discount percent), sorted by quantity.
DEFAULT_TIERS: tuple[tuple[int, float], ...] = ((10, 5), (50, 10), (100, 15))


def percent_of(amount_cents: int, percent: float) -> int:
    """Return ``percent`` % of ``amount_cents`` rounded half up to whole cents.

    The percentage is resolved to basis points (1/100 of a percent) so the
    computation itself is exact integer arithmetic.
    """
    if amount_cents < 0:
        return -percent_of(-amount_cents, percent)
    basis_points = round(percent * 100)
    return (amount_cents * basis_points + 5000) // 10000


def apply_discount(amount_cents: int, percent: float) -> int:
    """Reduce ``amount_cents`` by ``percent`` (which must lie in 0..100)."""
    if percent < 0 or percent > 100:
        raise ValueError(f"discount out of range: {percent}")
    return amount_cents - percent_of(amount_cents, percent)


def add_tax(amount_cents: int, rate_percent: float = 8.0) -> int:
    """Return the amount including tax at ``rate_percent``."""
    return amount_cents + percent_of(amount_cents, rate_percent)


def bulk_discount_percent(
    quantity: int, tiers: tuple[tuple[int, float], ...] = DEFAULT_TIERS
) -> float:
    """Discount percent of the highest tier whose minimum ``quantity`` reaches."""
    percent: float = 0
    for minimum, tier_percent in tiers:
        if quantity >= minimum:
            percent = tier_percent
        else:
            break
    return percent


def format_cents(amount_cents: int, symbol: str = "$") -> str:
    """Format cents as e.g. ``-$1,234.05``."""
    sign = "-" if amount_cents < 0 else ""
    dollars, cents = divmod(abs(amount_cents), 100)
    return f"{sign}{symbol}{dollars:,}.{cents:02d}"


def parse_price(text: str) -> int:
    """Parse ``"$1,234.5"`` or ``"-3"`` into integer cents."""
    cleaned = text.strip().replace("$", "").replace(",", "")
    negative = cleaned.startswith("-")
    if negative:
        cleaned = cleaned[1:]
    whole, _, frac = cleaned.partition(".")
    if len(frac) > 2:
        raise ValueError(f"too many decimals in {text!r}")
    frac = frac.ljust(2, "0")
    whole = whole or "0"
    if not (whole.isdigit() and frac.isdigit()):
        raise ValueError(f"not a price: {text!r}")
    value = int(whole) * 100 + int(frac)
    return -value if negative else value


def split_evenly(amount_cents: int, parts: int) -> list[int]:
    """Split an amount into ``parts`` shares differing by at most one cent.

    The first shares receive the leftover cents.
    """
    if parts <= 0:
        raise ValueError("parts must be positive")
    base, extra = divmod(amount_cents, parts)
    return [base + 1 if index < extra else base for index in range(parts)]
