import pytest
from ledger.interest import (
    accrue_daily,
    amortization_schedule,
    basis_points,
    compound_balance,
    div_round,
    monthly_payment,
    simple_interest,
)


def test_div_round_half_away_from_zero():
    assert div_round(7, 2) == 4
    assert div_round(5, 2) == 3
    assert div_round(4, 3) == 1
    assert div_round(5, 3) == 2
    assert div_round(0, 5) == 0
    assert div_round(-7, 2) == -4
    assert div_round(-4, 3) == -1
    assert div_round(-1, 2) == -1


def test_div_round_rejects_bad_denominator():
    with pytest.raises(ValueError):
        div_round(1, 0)
    with pytest.raises(ValueError):
        div_round(1, -3)
    assert div_round(3, 1) == 3


def test_basis_points():
    assert basis_points(4.25) == 425
    assert basis_points(3) == 300
    assert basis_points(0.01) == 1


def test_simple_interest():
    assert simple_interest(100000, 5, 365) == 5000
    assert simple_interest(100000, 5, 30) == 411
    assert simple_interest(100000, 5, 30, 360) == 417
    assert simple_interest(100000, 5, 0) == 0
    with pytest.raises(ValueError):
        simple_interest(100000, 5, -1)


def test_simple_interest_rounding_boundary():
    assert simple_interest(15000, 0.01, 1, 1) == 2
    assert simple_interest(14999, 0.01, 1, 1) == 1


def test_compound_balance():
    assert compound_balance(100000, 12, 3) == 103030
    assert compound_balance(100000, 12, 3, 4) == 109273
    assert compound_balance(100000, 12, 0) == 100000
    assert compound_balance(100000, 12, 1) == 101000


def test_compound_balance_rounding_boundary():
    assert compound_balance(15000, 0.01, 1, 1) == 15002
    assert compound_balance(14999, 0.01, 1, 1) == 15000


def test_accrue_daily_skips_overdrawn_days():
    balances = [1000000] * 10 + [-500, 0]
    assert accrue_daily(balances, 7.3) == 2000
    assert accrue_daily(balances, 7.3, 366) == 1995
    assert accrue_daily([], 5) == 0
    assert accrue_daily([-100000], 5) == 0


def test_accrue_daily_rounding_boundary():
    assert accrue_daily([15000], 0.01, 1) == 2
    assert accrue_daily([14999], 0.01, 1) == 1
    assert accrue_daily([14999, 1], 0.01, 1) == 2


def test_monthly_payment():
    assert monthly_payment(100000, 12, 12) == 8885
    assert monthly_payment(250000, 6.5, 36) == 7663
    assert monthly_payment(120000, 0, 12) == 10000
    assert monthly_payment(100000, 0, 3) == 33334
    with pytest.raises(ValueError):
        monthly_payment(100000, 5, 0)


def test_amortization_schedule_full():
    rows = amortization_schedule(100000, 12, 12)
    assert rows == [
        (1, 1000, 7885, 92115),
        (2, 921, 7964, 84151),
        (3, 842, 8043, 76108),
        (4, 761, 8124, 67984),
        (5, 680, 8205, 59779),
        (6, 598, 8287, 51492),
        (7, 515, 8370, 43122),
        (8, 431, 8454, 34668),
        (9, 347, 8538, 26130),
        (10, 261, 8624, 17506),
        (11, 175, 8710, 8796),
        (12, 88, 8796, 0),
    ]


def test_amortization_last_month_clears_balance():
    assert amortization_schedule(150, 12, 3) == [(1, 2, 50, 100), (2, 1, 51, 49), (3, 0, 49, 0)]
    assert amortization_schedule(100000, 0, 3) == [(1, 0, 33334, 66666), (2, 0, 33334, 33332), (3, 0, 33332, 0)]


def test_amortization_stops_early_when_paid_off():
    assert amortization_schedule(5, 0, 4) == [(1, 0, 2, 3), (2, 0, 2, 1), (3, 0, 1, 0)]
    assert len(amortization_schedule(10, 0, 6)) == 5


def test_amortization_interest_rounding_boundary():
    assert amortization_schedule(179999, 0.01, 1) == [(1, 1, 179999, 0)]
    assert amortization_schedule(180000, 0.01, 1) == [(1, 2, 180000, 0)]
