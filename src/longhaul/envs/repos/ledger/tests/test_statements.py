import pytest
from ledger import Ledger, LedgerError
from ledger.statements import (
    Statement,
    StatementLine,
    build_statement,
    daily_balances,
    maintenance_fee,
    render,
)


def test_statement_for_middle_of_month():
    ledger = Ledger()
    ledger.open_account("chk")
    ledger.deposit("chk", 100000, 1, "salary")
    ledger.withdraw("chk", 2500, 3, "coffee")
    ledger.withdraw("chk", 40000, 5, "rent")
    ledger.deposit("chk", 1000, 8, "refund")
    statement = build_statement(ledger, "chk", 3, 5)
    assert statement.opening_cents == 100000
    assert statement.lines == [
        StatementLine(3, "coffee", -2500, 97500),
        StatementLine(5, "rent", -40000, 57500),
    ]
    assert statement.closing_cents == 57500
    assert statement.credits_cents == 0
    assert statement.debits_cents == 42500
    assert statement.minimum_balance() == 57500


def test_statement_whole_period():
    ledger = Ledger()
    ledger.open_account("chk")
    ledger.deposit("chk", 100000, 1, "salary")
    ledger.withdraw("chk", 2500, 3, "coffee")
    ledger.withdraw("chk", 40000, 5, "rent")
    ledger.deposit("chk", 1000, 8, "refund")
    statement = build_statement(ledger, "chk", 1, 8)
    assert statement.opening_cents == 0
    assert [line.day for line in statement.lines] == [1, 3, 5, 8]
    assert statement.closing_cents == 58500
    assert statement.credits_cents == 101000
    assert statement.debits_cents == 42500
    assert statement.minimum_balance() == 0


def test_statement_without_activity():
    ledger = Ledger()
    ledger.open_account("chk")
    ledger.deposit("chk", 700, 1)
    statement = build_statement(ledger, "chk", 2, 2)
    assert statement.lines == []
    assert statement.opening_cents == 700
    assert statement.closing_cents == 700
    assert statement.minimum_balance() == 700
    with pytest.raises(LedgerError):
        build_statement(ledger, "chk", 3, 2)


def test_minimum_balance_tracks_dips():
    statement = Statement("x", 0, 9, 500, [
        StatementLine(1, "a", -300, 200),
        StatementLine(2, "b", -250, -50),
        StatementLine(3, "c", 1000, 950),
    ])
    assert statement.minimum_balance() == -50
    assert statement.closing_cents == 950
    assert statement.credits_cents == 1000
    assert statement.debits_cents == 550
    tiny = Statement("y", 0, 1, 0, [StatementLine(1, "in", 1, 1), StatementLine(1, "out", -1, 0)])
    assert tiny.credits_cents == 1
    assert tiny.debits_cents == 1


def test_daily_balances():
    ledger = Ledger()
    ledger.open_account("chk")
    ledger.deposit("chk", 100000, 1)
    ledger.withdraw("chk", 2500, 3)
    ledger.withdraw("chk", 500, 3)
    ledger.withdraw("chk", 40000, 5)
    ledger.deposit("chk", 10, 7)
    assert daily_balances(ledger, "chk", 0, 5) == [0, 100000, 100000, 97000, 97000, 57000]
    assert daily_balances(ledger, "chk", 3, 4) == [97000, 97000]
    assert daily_balances(ledger, "chk", 6, 7) == [57000, 57010]
    assert daily_balances(ledger, "chk", 2, 1) == []


def test_maintenance_fee_defaults():
    ledger = Ledger()
    ledger.open_account("rich")
    ledger.deposit("rich", 100000, 0)
    ledger.open_account("poor")
    ledger.deposit("poor", 99999, 0)
    assert maintenance_fee(build_statement(ledger, "rich", 1, 30)) == 0
    assert maintenance_fee(build_statement(ledger, "poor", 1, 30)) == 500


def test_maintenance_fee_custom():
    statement = Statement("x", 0, 9, 500, [StatementLine(1, "a", -300, 200)])
    assert maintenance_fee(statement, 250) == 250
    assert maintenance_fee(statement, 250, 200) == 0
    assert maintenance_fee(statement, 250, 201) == 250


def test_render_default_width():
    ledger = Ledger()
    ledger.open_account("chk")
    ledger.deposit("chk", 100000, 1, "salary")
    ledger.withdraw("chk", 2500, 3, "coffee")
    ledger.withdraw("chk", 40000, 15, "rent")
    text = render(build_statement(ledger, "chk", 2, 15))
    assert text.split("\n") == [
        "chk days 2-15",
        "opening                  1000.00",
        "   3 coffee               -25.00",
        "  15 rent                -400.00",
        "closing                   575.00",
    ]


def test_render_narrow_truncates_memo():
    statement = Statement("sav", 1, 2, 0, [StatementLine(2, "a very long memo text", 5, 5)])
    assert render(statement, 20) == "\n".join([
        "sav days 1-2",
        "opening         0.00",
        "   2 a v        0.05",
        "closing         0.05",
    ])
