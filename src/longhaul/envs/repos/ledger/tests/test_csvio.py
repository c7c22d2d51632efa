import pytest
from ledger import Ledger, LedgerError, Transaction
from ledger.csvio import (
    FIELDS,
    export_csv,
    format_amount,
    import_csv,
    parse_amount,
    replay,
)


def test_format_amount():
    assert format_amount(0) == "0.00"
    assert format_amount(5) == "0.05"
    assert format_amount(100) == "1.00"
    assert format_amount(-1205) == "-12.05"
    assert format_amount(-1) == "-0.01"
    assert format_amount(123456) == "1234.56"


def test_parse_amount_valid():
    assert parse_amount("12.5") == 1250
    assert parse_amount("-0.07") == -7
    assert parse_amount("3") == 300
    assert parse_amount("+4.10") == 410
    assert parse_amount(" 7.25 ") == 725
    assert parse_amount("-12") == -1200


def test_parse_amount_invalid():
    for bad in ("", "-", "abc", "1.234", "1.x", "1.", "1.2.3", "--1", "1,5"):
        with pytest.raises(ValueError):
            parse_amount(bad)


def test_format_parse_round_trip():
    for cents in (0, 1, -1, 99, -100, 123456, -987654):
        assert parse_amount(format_amount(cents)) == cents


def test_export_csv():
    transactions = [
        Transaction(1, "chk", 100000, "salary"),
        Transaction(3, "chk", -2500, "coffee, large"),
    ]
    assert export_csv(transactions) == (
        "day,account,amount,memo\n"
        "1,chk,1000.00,salary\n"
        '3,chk,-25.00,"coffee, large"\n'
    )
    assert export_csv([]) == "day,account,amount,memo\n"
    assert FIELDS == ["day", "account", "amount", "memo"]


def test_import_round_trip():
    transactions = [
        Transaction(1, "chk", 100000, "salary"),
        Transaction(3, "sav", -2500, "coffee, large"),
        Transaction(4, "chk", 7, ""),
    ]
    assert import_csv(export_csv(transactions)) == transactions


def test_import_tolerates_header_case_and_blank_lines():
    text = " Day ,ACCOUNT, amount,Memo\n\n2, chk ,5.5,x\n , , , \n3,chk,-1,y\n"
    assert import_csv(text) == [
        Transaction(2, "chk", 550, "x"),
        Transaction(3, "chk", -100, "y"),
    ]


def test_import_rejects_bad_header():
    with pytest.raises(LedgerError, match="header"):
        import_csv("")
    with pytest.raises(LedgerError, match="header"):
        import_csv("day,account,amount\n1,chk,1.00\n")


def test_import_reports_line_numbers():
    with pytest.raises(LedgerError, match="line 3: expected 4 fields, got 3"):
        import_csv("day,account,amount,memo\n1,chk,1.00,ok\n2,chk,1.00\n")
    with pytest.raises(LedgerError, match="line 2: invalid amount"):
        import_csv("day,account,amount,memo\n1,chk,1.234,x\n")
    with pytest.raises(LedgerError, match="line 4"):
        import_csv("day,account,amount,memo\n\n1,chk,1.00,x\nsoon,chk,1.00,x\n")


def test_replay_opens_accounts_and_posts():
    ledger = Ledger()
    transactions = [
        Transaction(2, "chk", 1000, "pay"),
        Transaction(3, "chk", -400, "shop"),
        Transaction(3, "chk", 0, "note"),
        Transaction(5, "sav", 250, "save"),
    ]
    assert replay(ledger, transactions) == 3
    assert ledger.balance("chk") == 600
    assert ledger.balance("sav") == 250
    assert ledger.account("chk").opened_day == 2
    assert ledger.account("sav").opened_day == 5
    assert [t.memo for t in ledger.history("chk")] == ["pay", "shop"]


def test_replay_into_existing_account_and_failure():
    ledger = Ledger()
    ledger.open_account("chk", opened_day=0)
    assert replay(ledger, [Transaction(1, "chk", 100, "a")]) == 1
    assert ledger.account("chk").opened_day == 0
    with pytest.raises(LedgerError):
        replay(ledger, [Transaction(2, "chk", -101, "too much")])
    assert replay(ledger, []) == 0


def test_replay_one_cent_amounts():
    ledger = Ledger()
    assert replay(ledger, [Transaction(1, "chk", 1, "in"), Transaction(2, "chk", -1, "out")]) == 2
    assert [t.amount_cents for t in ledger.history("chk")] == [1, -1]
