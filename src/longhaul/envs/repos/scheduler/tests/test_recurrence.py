import pytest
from scheduler.recurrence import WEEKDAYS, Recurrence, is_weekend, next_weekday, weekday


def test_weekday():
    assert WEEKDAYS[0] == "Mon"
    assert weekday(0) == "Mon"
    assert weekday(6) == "Sun"
    assert weekday(7) == "Mon"
    assert weekday(12) == "Sat"
    assert weekday(-1) == "Sun"


def test_is_weekend():
    assert is_weekend(4) is False
    assert is_weekend(5) is True
    assert is_weekend(6) is True
    assert is_weekend(7) is False
    assert is_weekend(-2) is True
    assert is_weekend(-3) is False


def test_next_weekday():
    assert next_weekday(0, "Wed") == 2
    assert next_weekday(2, "Wed") == 2
    assert next_weekday(3, "Wed") == 9
    assert next_weekday(10, "Mon") == 14
    assert next_weekday(13, "Sun") == 13
    with pytest.raises(ValueError):
        next_weekday(0, "Funday")


def test_recurrence_defaults():
    rule = Recurrence(3)
    assert rule.every == 1
    assert rule.count is None
    assert rule.until is None
    assert rule.skip_weekends is False
    days = rule.occurrences()
    assert len(days) == 50
    assert days[:3] == [3, 4, 5]
    assert days[-1] == 52


def test_recurrence_validation():
    with pytest.raises(ValueError):
        Recurrence(0, every=0)
    with pytest.raises(ValueError):
        Recurrence(0, count=-1)
    with pytest.raises(ValueError):
        Recurrence(5, every=7, skip_weekends=True)
    with pytest.raises(ValueError):
        Recurrence(6, every=14, skip_weekends=True)
    assert Recurrence(0, every=7, skip_weekends=True).occurrences(2) == [0, 7]
    assert Recurrence(5, every=7).occurrences(2) == [5, 12]
    assert Recurrence(5, every=6, skip_weekends=True).occurrences(2) == [11, 17]


def test_occurrences_with_count_and_limit():
    assert Recurrence(0, every=2, count=3).occurrences() == [0, 2, 4]
    assert Recurrence(0, every=2).occurrences(3) == [0, 2, 4]
    assert Recurrence(0, count=0).occurrences() == []
    assert Recurrence(0, count=5).occurrences(2) == [0, 1]


def test_occurrences_until_inclusive():
    assert Recurrence(0, every=3, until=9).occurrences() == [0, 3, 6, 9]
    assert Recurrence(0, every=3, until=8).occurrences() == [0, 3, 6]
    assert Recurrence(0, count=10, until=3).occurrences() == [0, 1, 2, 3]
    assert Recurrence(4, until=3).occurrences() == []


def test_occurrences_skip_weekends_counts_skipped_slots():
    rule = Recurrence(3, count=5, skip_weekends=True)
    assert rule.occurrences() == [3, 4, 7]
    assert Recurrence(0, skip_weekends=True).occurrences(6) == [0, 1, 2, 3, 4, 7]


def test_occurs_on():
    rule = Recurrence(2, every=3, count=4)
    assert rule.occurs_on(2)
    assert rule.occurs_on(11)
    assert not rule.occurs_on(14)
    assert not rule.occurs_on(3)
    assert not rule.occurs_on(1)
    assert not rule.occurs_on(-1)
    assert not Recurrence(2, every=3).occurs_on(-1)
    assert not Recurrence(5).occurs_on(4)


def test_occurs_on_until_and_weekends():
    rule = Recurrence(2, every=3, until=8)
    assert rule.occurs_on(8)
    assert not rule.occurs_on(11)
    weekdays_only = Recurrence(0, skip_weekends=True)
    assert not weekdays_only.occurs_on(5)
    assert weekdays_only.occurs_on(7)
    assert Recurrence(0).occurs_on(5)


def test_next_after():
    rule = Recurrence(2, every=3, count=4)
    assert rule.next_after(0) == 2
    assert rule.next_after(1) == 2
    assert rule.next_after(2) == 5
    assert rule.next_after(3) == 5
    assert rule.next_after(10) == 11
    assert rule.next_after(11) is None


def test_next_after_limits_and_weekends():
    assert Recurrence(0, every=7, until=14).next_after(13) == 14
    assert Recurrence(0, every=7, until=14).next_after(14) is None
    assert Recurrence(0, skip_weekends=True).next_after(4) == 7
    assert Recurrence(0, skip_weekends=True).next_after(5) == 7
    assert Recurrence(0, count=6, skip_weekends=True).next_after(4) is None
