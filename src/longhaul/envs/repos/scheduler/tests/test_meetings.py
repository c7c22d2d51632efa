import pytest
from scheduler import Interval, Recurrence
from scheduler.meetings import DAY_MINUTES, Calendar, ConflictError, Meeting


def test_calendar_default_hours():
    calendar = Calendar()
    assert calendar.hours == Interval(540, 1020)
    assert calendar.meetings == []
    assert DAY_MINUTES == 1440


def test_calendar_rejects_bad_hours():
    with pytest.raises(ValueError):
        Calendar(600, 600)
    with pytest.raises(ValueError):
        Calendar(700, 600)
    with pytest.raises(ValueError):
        Calendar(-1, 100)
    with pytest.raises(ValueError):
        Calendar(0, 1441)
    assert Calendar(0, 1440).hours.length == 1440


def test_add_meeting():
    calendar = Calendar()
    meeting = calendar.add("sync", 1, 600, 630, ("ann", "bob"))
    assert meeting == Meeting("sync", 1, Interval(600, 630), frozenset({"ann", "bob"}))
    assert calendar.meetings == [meeting]
    assert calendar.add("solo", 1, 700, 710).attendees == frozenset()


def test_add_respects_working_hours():
    calendar = Calendar()
    calendar.add("first", 0, 540, 600)
    calendar.add("last", 0, 960, 1020)
    with pytest.raises(ValueError):
        calendar.add("early", 0, 539, 600)
    with pytest.raises(ValueError):
        calendar.add("late", 0, 960, 1021)
    with pytest.raises(ValueError):
        calendar.add("empty", 0, 600, 600)
    with pytest.raises(ValueError):
        calendar.add("backwards", 0, 630, 600)
    assert len(calendar.meetings) == 2


def test_clashes_with():
    base = Meeting("a", 1, Interval(600, 660), frozenset({"ann", "bob"}))
    assert base.clashes_with(Meeting("b", 1, Interval(630, 700), frozenset({"bob"})))
    assert not base.clashes_with(Meeting("c", 1, Interval(630, 700), frozenset({"cat"})))
    assert not base.clashes_with(Meeting("d", 1, Interval(660, 700), frozenset({"ann"})))
    assert not base.clashes_with(Meeting("e", 2, Interval(600, 660), frozenset({"ann"})))


def test_conflicting_meeting_is_rejected():
    calendar = Calendar()
    calendar.add("review", 1, 600, 660, ("ann",))
    calendar.add("standup", 1, 630, 645, ("bob",))
    with pytest.raises(ConflictError, match="clashes with review, standup"):
        calendar.add("planning", 1, 620, 640, ("ann", "bob"))
    assert [m.title for m in calendar.meetings] == ["review", "standup"]
    calendar.add("planning", 1, 660, 700, ("ann", "bob"))
    assert len(calendar.meetings) == 3


def test_meetings_are_kept_sorted():
    calendar = Calendar()
    calendar.add("c", 2, 600, 630)
    calendar.add("b", 1, 700, 730)
    calendar.add("a", 1, 600, 630)
    calendar.add("aa", 1, 600, 615)
    assert [m.title for m in calendar.meetings] == ["a", "aa", "b", "c"]


def test_add_recurring():
    calendar = Calendar()
    rule = Recurrence(0, count=7, skip_weekends=True)
    added = calendar.add_recurring("standup", rule, 555, 570, ("ann",))
    assert [m.day for m in added] == [0, 1, 2, 3, 4]
    assert len(calendar.meetings) == 5
    assert calendar.add_recurring("weekly", Recurrence(0, every=7), 600, 660, limit=3)[-1].day == 14


def test_add_recurring_default_limit():
    calendar = Calendar()
    added = calendar.add_recurring("daily", Recurrence(0), 600, 610)
    assert len(added) == 50
    assert added[-1].day == 49


def test_add_recurring_is_all_or_nothing():
    calendar = Calendar()
    calendar.add("dentist", 3, 550, 600, ("ann",))
    with pytest.raises(ConflictError):
        calendar.add_recurring("standup", Recurrence(0, count=5), 555, 570, ("ann",))
    assert [m.title for m in calendar.meetings] == ["dentist"]


def test_cancel():
    calendar = Calendar()
    calendar.add("a", 1, 600, 630)
    calendar.add("a", 2, 600, 630)
    calendar.add("b", 2, 700, 730)
    removed = calendar.cancel("a", 2)
    assert removed.day == 2
    assert [(m.title, m.day) for m in calendar.meetings] == [("a", 1), ("b", 2)]
    with pytest.raises(KeyError):
        calendar.cancel("a", 2)


def test_on_day_and_busy():
    calendar = Calendar()
    calendar.add("x", 1, 600, 660, ("ann",))
    calendar.add("y", 1, 540, 600, ("ann", "bob"))
    calendar.add("z", 1, 700, 720, ("bob",))
    calendar.add("w", 2, 600, 660, ("ann",))
    assert [m.title for m in calendar.on_day(1)] == ["y", "x", "z"]
    assert [m.title for m in calendar.on_day(1, "bob")] == ["y", "z"]
    assert calendar.busy("ann", 1) == [Interval(540, 660)]
    assert calendar.busy("bob", 1) == [Interval(540, 600), Interval(700, 720)]
    assert calendar.busy("cat", 1) == []


def test_free_slots_default_minimum():
    calendar = Calendar()
    calendar.add("a", 1, 600, 660, ("ann",))
    calendar.add("b", 1, 689, 700, ("ann",))
    assert calendar.free_slots("ann", 1) == [Interval(540, 600), Interval(700, 1020)]
    assert calendar.free_slots("ann", 1, 29) == [Interval(540, 600), Interval(660, 689), Interval(700, 1020)]


def test_free_slots_exact_minimum():
    calendar = Calendar()
    calendar.add("a", 1, 570, 1020, ("ann",))
    assert calendar.free_slots("ann", 1) == [Interval(540, 570)]
    assert calendar.free_slots("ann", 1, min_length=31) == []
    assert calendar.free_slots("ann", 2) == [Interval(540, 1020)]


def test_find_common_slot():
    calendar = Calendar()
    calendar.add("a", 1, 540, 600, ("ann",))
    calendar.add("b", 1, 570, 660, ("bob",))
    assert calendar.find_common_slot(["ann", "bob"], 1, 30) == Interval(660, 690)
    assert calendar.find_common_slot(["ann"], 1, 30) == Interval(600, 630)
    assert calendar.find_common_slot(["ann", "bob"], 1, 30, earliest=700) == Interval(700, 730)
    assert calendar.find_common_slot(["ann", "bob"], 2, 45) == Interval(540, 585)
    assert Calendar(0, 100).find_common_slot(["ann"], 1, 10) == Interval(0, 10)


def test_find_common_slot_exact_fit_and_failures():
    calendar = Calendar()
    calendar.add("a", 1, 540, 600, ("ann",))
    calendar.add("b", 1, 630, 1020, ("bob",))
    assert calendar.find_common_slot(["ann", "bob"], 1, 30) == Interval(600, 630)
    assert calendar.find_common_slot(["ann", "bob"], 1, 31) is None
    assert calendar.find_common_slot(["ann"], 1, 30, earliest=1020) is None
    assert calendar.find_common_slot(["ann"], 1, 30, earliest=990) == Interval(990, 1020)
    assert calendar.find_common_slot(["ann"], 1, 31, earliest=990) is None


def test_utilization():
    calendar = Calendar()
    calendar.add("a", 1, 540, 600, ("ann",))
    calendar.add("b", 1, 600, 660, ("ann", "bob"))
    assert calendar.utilization("ann", 1) == 0.25
    assert calendar.utilization("bob", 1) == 0.125
    assert calendar.utilization("ann", 2) == 0.0
    assert Calendar(0, 100).utilization("ann", 1) == 0.0
