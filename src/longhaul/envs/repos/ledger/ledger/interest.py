"""Interest calculations in integer cents.

Rates are annual percentages; they are resolved to whole basis points so the
arithmetic stays exact.
"""

from __future__ import annotations

import math


def div_round(numerator: int, denominator: int) -> int:
    """Integer division rounding halves away from zero."""
    if denominator <= 0:
        raise ValueError("denominator must be positive")
    if numerator < 0:
        return -div_round(-numerator, denominator)
    return (2 * numerator + denominator) // (2 * denominator)


def basis_points(rate_percent: float) -> int:
    """Convert a percentage such as 4.25 to basis points (425)."""
    return round(rate_percent * 100)


def simple_interest(principal_cents: int, rate_percent: float, days: int, year_days: int = 365) -> int:
    """Interest earned on ``principal_cents`` over ``days`` days."""
    if days < 0:
        raise ValueError("days must not be negative")
    numerator = principal_cents * basis_points(rate_percent) * days
    return div_round(numerator, 10000 * year_days)


def compound_balance(principal_cents: int, rate_percent: float, periods: int, periods_per_year: int = 12) -> int:
    """Balance after ``periods`` compounding periods, rounding to cents each period."""
    balance = principal_cents
    points = basis_points(rate_percent)
    for _ in range(periods):
        balance += div_round(balance * points, 10000 * periods_per_year)
    return balance


def accrue_daily(balances_cents: list[int], rate_percent: float, year_days: int = 365) -> int:
    """Interest on a list of end-of-day balances; overdrawn days earn nothing."""
    positive_total = 0
    for balance in balances_cents:
        if balance > 0:
            positive_total += balance
    return div_round(positive_total * basis_points(rate_percent), 10000 * year_days)


def monthly_payment(principal_cents: int, rate_percent: float, months: int) -> int:
    """Level monthly payment that repays a loan, rounded up to the next cent."""
    if months <= 0:
        raise ValueError("months must be positive")
    if rate_percent == 0:
        return -(-principal_cents // months)
    monthly_rate = rate_percent / 1200
    payment = principal_cents * monthly_rate / (1 - (1 + monthly_rate) ** -months)
    return math.ceil(round(payment, 6))


def amortization_schedule(principal_cents: int, rate_percent: float, months: int) -> list[tuple[int, int, int, int]]:
    """Rows of ``(month, interest, principal_paid, remaining)`` starting at month 1.

    The final row pays off whatever is left, so ``remaining`` ends at zero.
    """
    payment = monthly_payment(principal_cents, rate_percent, months)
    points = basis_points(rate_percent)
    remaining = principal_cents
    rows = []
    for month in range(1, months + 1):
        interest = div_round(remaining * points, 120000)
        principal_paid = payment - interest
        if month == months or principal_paid > remaining:
            principal_paid = remaining
        remaining -= principal_paid
        rows.append((month, interest, principal_paid, remaining))
        if remaining == 0:
            break
    return rows
