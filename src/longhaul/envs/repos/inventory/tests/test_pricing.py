import pytest
from inventory.pricing import (
    DEFAULT_TIERS,
    add_tax,
    apply_discount,
    bulk_discount_percent,
    format_cents,
    parse_price,
    percent_of,
    split_evenly,
)


def test_percent_of_exact():
    assert percent_of(10000, 8) == 800
    assert percent_of(10000, 50) == 5000
    assert percent_of(2000, 7.25) == 145
    assert percent_of(0, 30) == 0


def test_percent_of_rounds_half_up():
    assert percent_of(4999, 0.01) == 0
    assert percent_of(5000, 0.01) == 1
    assert percent_of(15001, 0.01) == 2
    assert percent_of(1234, 10) == 123
    assert percent_of(1235, 10) == 124


def test_percent_of_uses_whole_basis_points():
    # 0.125% resolves to 12 basis points (round half to even).
    assert percent_of(400, 0.125) == 0
    assert percent_of(-400, 0.125) == 0
    assert percent_of(417, 0.125) == 1
    assert apply_discount(400, 0.125) == 400
    assert add_tax(400, 0.125) == 400


def test_percent_of_negative_amount_rounds_away_from_zero():
    assert percent_of(-1000, 8) == -80
    assert percent_of(-1, 50) == -1
    assert percent_of(-3, 50) == -2


def test_apply_discount():
    assert apply_discount(1000, 15) == 850
    assert apply_discount(999, 50) == 499
    assert apply_discount(1000, 0) == 1000
    assert apply_discount(1000, 100) == 0


def test_apply_discount_range_checked():
    with pytest.raises(ValueError):
        apply_discount(1000, 101)
    with pytest.raises(ValueError):
        apply_discount(1000, 100.5)
    with pytest.raises(ValueError):
        apply_discount(1000, -1)
    with pytest.raises(ValueError):
        apply_discount(1000, -0.5)


def test_add_tax_default_and_custom_rate():
    assert add_tax(1000) == 1080
    assert add_tax(1999) == 2159
    assert add_tax(1000, 20) == 1200
    assert add_tax(1000, 0) == 1000


def test_bulk_discount_default_tiers():
    assert DEFAULT_TIERS == ((10, 5), (50, 10), (100, 15))
    assert bulk_discount_percent(1) == 0
    assert bulk_discount_percent(9) == 0
    assert bulk_discount_percent(10) == 5
    assert bulk_discount_percent(49) == 5
    assert bulk_discount_percent(50) == 10
    assert bulk_discount_percent(99) == 10
    assert bulk_discount_percent(100) == 15
    assert bulk_discount_percent(5000) == 15


def test_bulk_discount_custom_tiers():
    tiers = ((2, 1.5), (4, 3))
    assert bulk_discount_percent(1, tiers) == 0
    assert bulk_discount_percent(2, tiers) == 1.5
    assert bulk_discount_percent(3, tiers) == 1.5
    assert bulk_discount_percent(4, tiers) == 3
    assert bulk_discount_percent(7, ()) == 0


def test_bulk_discount_stops_at_first_unreached_tier():
    # An unsorted tier list: scanning stops at the first tier not reached.
    tiers = ((5, 2), (20, 8), (10, 4))
    assert bulk_discount_percent(12, tiers) == 2


def test_format_cents():
    assert format_cents(0) == "$0.00"
    assert format_cents(5) == "$0.05"
    assert format_cents(-1) == "-$0.01"
    assert format_cents(100) == "$1.00"
    assert format_cents(123456) == "$1,234.56"
    assert format_cents(-1999) == "-$19.99"
    assert format_cents(250, "EUR ") == "EUR 2.50"


def test_parse_price_basic():
    assert parse_price("12.34") == 1234
    assert parse_price("$1,234.5") == 123450
    assert parse_price("  7 ") == 700
    assert parse_price(".5") == 50
    assert parse_price("0.07") == 7
    assert parse_price("3.") == 300


def test_parse_price_negative():
    assert parse_price("-3") == -300
    assert parse_price("-$0.25") == -25


def test_parse_price_errors():
    with pytest.raises(ValueError, match="too many decimals"):
        parse_price("1.234")
    with pytest.raises(ValueError, match="not a price"):
        parse_price("12a.50")
    with pytest.raises(ValueError, match="not a price"):
        parse_price("12.5b")
    with pytest.raises(ValueError, match="not a price"):
        parse_price("--4")


def test_parse_and_format_round_trip():
    for cents in (0, 1, 99, 100, 123456789, -42):
        assert parse_price(format_cents(cents)) == cents


def test_split_evenly():
    assert split_evenly(10, 3) == [4, 3, 3]
    assert split_evenly(11, 3) == [4, 4, 3]
    assert split_evenly(9, 3) == [3, 3, 3]
    assert split_evenly(2, 4) == [1, 1, 0, 0]
    assert split_evenly(7, 1) == [7]


def test_split_evenly_rejects_bad_parts():
    with pytest.raises(ValueError):
        split_evenly(10, 0)
    with pytest.raises(ValueError):
        split_evenly(10, -2)
