import pytest
from ledger.accounts import Account, Ledger, LedgerError, Transaction


def test_open_account_defaults():
    ledger = Ledger()
    account = ledger.open_account("chk")
    assert account.name == "chk"
    assert account.overdraft_limit_cents == 0
    assert account.opened_day == 0
    assert account.balance_cents == 0
    assert account.last_day == 0
    assert ledger.account("chk") is account


def test_open_account_validation():
    ledger = Ledger()
    ledger.open_account("chk", 0, 4)
    assert ledger.account("chk").last_day == 4
    with pytest.raises(LedgerError):
        ledger.open_account("chk")
    with pytest.raises(LedgerError):
        ledger.open_account("sav", -1)
    with pytest.raises(LedgerError):
        ledger.account("nope")


def test_account_dataclass_defaults():
    account = Account("sav")
    assert account.overdraft_limit_cents == 0
    assert account.opened_day == 0
    assert account.balance_cents == 0
    assert account.last_day == 0


def test_one_cent_movements():
    ledger = Ledger()
    ledger.open_account("chk")
    ledger.deposit("chk", 1, 1)
    ledger.withdraw("chk", 1, 1)
    assert [t.amount_cents for t in ledger.transactions] == [1, -1]
    assert ledger.balance("chk") == 0


def test_can_withdraw_respects_overdraft():
    account = Account("chk", 500, balance_cents=100)
    assert account.can_withdraw(600) is True
    assert account.can_withdraw(601) is False
    plain = Account("sav", balance_cents=100)
    assert plain.can_withdraw(100) is True
    assert plain.can_withdraw(101) is False


def test_deposit():
    ledger = Ledger()
    ledger.open_account("chk")
    txn = ledger.deposit("chk", 1500, 2)
    assert txn == Transaction(2, "chk", 1500, "deposit")
    ledger.deposit("chk", 250, 3, "gift")
    assert ledger.balance("chk") == 1750
    assert ledger.transactions[-1].memo == "gift"
    with pytest.raises(LedgerError):
        ledger.deposit("chk", 0, 3)
    with pytest.raises(LedgerError):
        ledger.deposit("chk", -5, 3)


def test_withdraw():
    ledger = Ledger()
    ledger.open_account("chk")
    ledger.deposit("chk", 1000, 1)
    txn = ledger.withdraw("chk", 400, 2)
    assert txn == Transaction(2, "chk", -400, "withdrawal")
    assert ledger.balance("chk") == 600
    ledger.withdraw("chk", 600, 2, "cash")
    assert ledger.balance("chk") == 0
    assert ledger.transactions[-1].memo == "cash"
    with pytest.raises(LedgerError):
        ledger.withdraw("chk", 1, 3)
    with pytest.raises(LedgerError):
        ledger.withdraw("chk", 0, 3)


def test_withdraw_into_overdraft():
    ledger = Ledger()
    ledger.open_account("chk", overdraft_limit_cents=500)
    ledger.deposit("chk", 100, 1)
    ledger.withdraw("chk", 600, 1)
    assert ledger.balance("chk") == -500
    with pytest.raises(LedgerError):
        ledger.withdraw("chk", 1, 2)
    assert len(ledger.transactions) == 2


def test_no_entries_before_opening_day():
    ledger = Ledger()
    ledger.open_account("chk", opened_day=5)
    with pytest.raises(LedgerError):
        ledger.deposit("chk", 100, 4)
    ledger.deposit("chk", 100, 5)
    assert ledger.balance("chk") == 100


def test_entries_must_be_in_day_order():
    ledger = Ledger()
    ledger.open_account("chk")
    ledger.deposit("chk", 100, 10)
    assert ledger.account("chk").last_day == 10
    with pytest.raises(LedgerError):
        ledger.deposit("chk", 100, 9)
    ledger.deposit("chk", 100, 10)
    ledger.withdraw("chk", 50, 11)
    assert ledger.balance("chk") == 150
    assert ledger.account("chk").last_day == 11


def test_transfer_moves_money():
    ledger = Ledger()
    ledger.open_account("a")
    ledger.open_account("b")
    ledger.deposit("a", 1000, 1)
    debit = ledger.transfer("a", "b", 300, 2)
    assert debit == Transaction(2, "a", -300, "transfer to b")
    assert ledger.transactions[-1] == Transaction(2, "b", 300, "transfer from a")
    assert ledger.balance("a") == 700
    assert ledger.balance("b") == 300


def test_transfer_failures_post_nothing():
    ledger = Ledger()
    ledger.open_account("a")
    ledger.open_account("late", opened_day=9)
    ledger.deposit("a", 1000, 1)
    with pytest.raises(LedgerError):
        ledger.transfer("a", "a", 100, 2)
    with pytest.raises(LedgerError):
        ledger.transfer("a", "missing", 100, 2)
    with pytest.raises(LedgerError):
        ledger.transfer("a", "late", 100, 2)
    with pytest.raises(LedgerError):
        ledger.transfer("a", "late", 1001, 9)
    assert ledger.balance("a") == 1000
    assert ledger.balance("late") == 0
    assert len(ledger.transactions) == 1


def test_transfer_rejected_when_target_has_later_entries():
    ledger = Ledger()
    ledger.open_account("a")
    ledger.open_account("b")
    ledger.deposit("a", 1000, 1)
    ledger.deposit("b", 50, 6)
    with pytest.raises(LedgerError):
        ledger.transfer("a", "b", 100, 5)
    assert ledger.balance("a") == 1000
    ledger.transfer("a", "b", 100, 6)
    assert ledger.balance("b") == 150


def test_balance_as_of_day():
    ledger = Ledger()
    ledger.open_account("chk")
    ledger.open_account("sav")
    ledger.deposit("chk", 100, 1)
    ledger.deposit("sav", 7000, 2)
    ledger.deposit("chk", 200, 3)
    ledger.withdraw("chk", 50, 5)
    assert ledger.balance("chk", 0) == 0
    assert ledger.balance("chk", 1) == 100
    assert ledger.balance("chk", 2) == 100
    assert ledger.balance("chk", 3) == 300
    assert ledger.balance("chk", 5) == 250
    assert ledger.balance("chk") == 250
    with pytest.raises(LedgerError):
        ledger.balance("nope", 3)


def test_history_filters_inclusive():
    ledger = Ledger()
    ledger.open_account("chk")
    ledger.open_account("sav")
    for day in (1, 3, 5, 7):
        ledger.deposit("chk", day * 10, day)
    ledger.deposit("sav", 999, 4)
    assert [t.day for t in ledger.history("chk")] == [1, 3, 5, 7]
    assert [t.day for t in ledger.history("chk", 3)] == [3, 5, 7]
    assert [t.day for t in ledger.history("chk", end_day=5)] == [1, 3, 5]
    assert [t.day for t in ledger.history("chk", 3, 5)] == [3, 5]
    assert [t.day for t in ledger.history("chk", 4, 4)] == []
    assert [t.amount_cents for t in ledger.history("sav")] == [999]
    with pytest.raises(LedgerError):
        ledger.history("nope")


def test_total_and_accounts_below():
    ledger = Ledger()
    ledger.open_account("a", overdraft_limit_cents=1000)
    ledger.open_account("b")
    ledger.open_account("c")
    ledger.open_account("d", overdraft_limit_cents=5)
    ledger.withdraw("a", 300, 1)
    ledger.deposit("b", 500, 1)
    ledger.withdraw("d", 1, 1)
    assert ledger.total_cents() == 199
    assert ledger.accounts_below() == ["a", "d"]
    assert ledger.accounts_below(-1) == ["a"]
    assert ledger.accounts_below(500) == ["a", "c", "d"]
    assert ledger.accounts_below(501) == ["a", "b", "c", "d"]
