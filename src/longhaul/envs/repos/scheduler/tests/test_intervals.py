import pytest
from scheduler.intervals import Interval, max_overlap, merge, subtract, total_length


def test_interval_basics():
    interval = Interval(3, 8)
    assert interval.length == 5
    assert interval.is_empty() is False
    assert Interval(4, 4).is_empty() is True
    assert Interval(4, 4).length == 0
    with pytest.raises(ValueError):
        Interval(5, 3)


def test_contains_is_half_open():
    interval = Interval(10, 20)
    assert interval.contains(10)
    assert interval.contains(19)
    assert not interval.contains(20)
    assert not interval.contains(9)


def test_covers():
    outer = Interval(0, 10)
    assert outer.covers(Interval(0, 10))
    assert outer.covers(Interval(2, 5))
    assert not outer.covers(Interval(5, 11))
    assert not outer.covers(Interval(-1, 5))


def test_overlaps():
    assert Interval(0, 10).overlaps(Interval(5, 15))
    assert Interval(5, 15).overlaps(Interval(0, 6))
    assert Interval(0, 10).overlaps(Interval(9, 10))
    assert Interval(0, 10).overlaps(Interval(2, 3))
    assert not Interval(0, 10).overlaps(Interval(10, 20))
    assert not Interval(10, 20).overlaps(Interval(0, 10))
    assert not Interval(0, 5).overlaps(Interval(7, 9))


def test_intersection():
    assert Interval(0, 10).intersection(Interval(5, 15)) == Interval(5, 10)
    assert Interval(5, 15).intersection(Interval(0, 10)) == Interval(5, 10)
    assert Interval(0, 10).intersection(Interval(2, 3)) == Interval(2, 3)
    assert Interval(0, 10).intersection(Interval(10, 20)) is None
    assert Interval(0, 5).intersection(Interval(7, 9)) is None


def test_shifted_and_ordering():
    assert Interval(1, 3).shifted(5) == Interval(6, 8)
    assert Interval(1, 3).shifted(-1) == Interval(0, 2)
    assert sorted([Interval(2, 3), Interval(1, 5), Interval(1, 2)]) == [
        Interval(1, 2),
        Interval(1, 5),
        Interval(2, 3),
    ]


def test_merge_overlapping():
    intervals = [Interval(5, 8), Interval(1, 3), Interval(2, 4), Interval(10, 12)]
    assert merge(intervals) == [Interval(1, 4), Interval(5, 8), Interval(10, 12)]
    assert merge([Interval(1, 10), Interval(2, 3)]) == [Interval(1, 10)]
    later = [Interval(8, 10), Interval(1, 2), Interval(7, 9), Interval(4, 5)]
    assert merge(later) == [Interval(1, 2), Interval(4, 5), Interval(7, 10)]
    assert merge([]) == []


def test_merge_touching_and_gap():
    assert merge([Interval(1, 3), Interval(3, 5)]) == [Interval(1, 5)]
    assert merge([Interval(1, 3), Interval(4, 6)]) == [Interval(1, 3), Interval(4, 6)]
    assert merge([Interval(1, 3), Interval(4, 6)], gap=1) == [Interval(1, 6)]
    assert merge([Interval(1, 3), Interval(5, 6)], 1) == [Interval(1, 3), Interval(5, 6)]


def test_merge_drops_empty_intervals():
    assert merge([Interval(3, 3), Interval(1, 2)]) == [Interval(1, 2)]
    assert merge([Interval(3, 3)]) == []


def test_total_length():
    assert total_length([Interval(0, 10), Interval(5, 15), Interval(20, 25)]) == 20
    assert total_length([Interval(0, 1)]) == 1
    assert total_length([]) == 0


def test_subtract_blocks_inside_base():
    base = Interval(0, 100)
    blocks = [Interval(50, 60), Interval(10, 20), Interval(15, 30)]
    assert subtract(base, blocks) == [Interval(0, 10), Interval(30, 50), Interval(60, 100)]
    assert subtract(base, []) == [base]


def test_subtract_blocks_at_the_edges():
    assert subtract(Interval(50, 100), [Interval(0, 10), Interval(40, 60)]) == [Interval(60, 100)]
    assert subtract(Interval(0, 10), [Interval(0, 3)]) == [Interval(3, 10)]
    assert subtract(Interval(0, 10), [Interval(5, 10)]) == [Interval(0, 5)]
    assert subtract(Interval(0, 10), [Interval(15, 20)]) == [Interval(0, 10)]
    assert subtract(Interval(10, 20), [Interval(0, 30)]) == []


def test_max_overlap():
    assert max_overlap([Interval(0, 10), Interval(5, 15), Interval(10, 20)]) == 2
    assert max_overlap([Interval(0, 10), Interval(0, 10), Interval(0, 10)]) == 3
    assert max_overlap([Interval(0, 5), Interval(5, 10)]) == 1
    assert max_overlap([Interval(3, 3), Interval(3, 3)]) == 0
    assert max_overlap([]) == 0


def test_max_overlap_nested():
    intervals = [Interval(0, 100), Interval(10, 20), Interval(15, 30), Interval(18, 19), Interval(40, 50)]
    assert max_overlap(intervals) == 4


def test_max_overlap_later_peak():
    intervals = [Interval(0, 3), Interval(1, 4), Interval(5, 8), Interval(5, 9), Interval(6, 10)]
    assert max_overlap(intervals) == 3
