"""A shared calendar of meetings with per-person conflict detection.

Times are minutes after midnight; days are integer day numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .intervals import Interval, merge, subtract, total_length
from .recurrence import Recurrence

DAY_MINUTES = 24 * 60


class ConflictError(Exception):
    """Raised when a meeting would double-book an attendee."""


@dataclass(frozen=True)
class Meeting:
    title: str
    day: int
    slot: Interval
    attendees: frozenset[str] = field(default_factory=frozenset)

    def clashes_with(self, other: Meeting) -> bool:
        """Same day, overlapping times and at least one shared attendee."""
        return self.day == other.day and self.slot.overlaps(other.slot) and bool(self.attendees & other.attendees)


class Calendar:
    """Meetings inside daily working hours ``[work_start, work_end)``."""

    def __init__(self, work_start: int = 9 * 60, work_end: int = 17 * 60) -> None:
        if work_start < 0 or work_end > DAY_MINUTES or work_start >= work_end:
            raise ValueError("invalid working hours")
        self.hours = Interval(work_start, work_end)
        self.meetings: list[Meeting] = []

    def _make(self, title: str, day: int, start: int, end: int, attendees: tuple[str, ...]) -> Meeting:
        if start >= end:
            raise ValueError("a meeting must end after it starts")
        slot = Interval(start, end)
        if not self.hours.covers(slot):
            raise ValueError(f"{title} is outside working hours")
        return Meeting(title, day, slot, frozenset(attendees))

    def conflicts(self, meeting: Meeting) -> list[Meeting]:
        return [existing for existing in self.meetings if existing.clashes_with(meeting)]

    def _insert(self, meetings: list[Meeting]) -> None:
        for meeting in meetings:
            clashes = self.conflicts(meeting)
            if clashes:
                names = ", ".join(sorted(m.title for m in clashes))
                raise ConflictError(f"{meeting.title} on day {meeting.day} clashes with {names}")
        self.meetings.extend(meetings)
        self.meetings.sort(key=lambda m: (m.day, m.slot.start, m.title))

    def add(self, title: str, day: int, start: int, end: int, attendees: tuple[str, ...] = ()) -> Meeting:
        meeting = self._make(title, day, start, end, attendees)
        self._insert([meeting])
        return meeting

    def add_recurring(
        self, title: str, rule: Recurrence, start: int, end: int, attendees: tuple[str, ...] = (), limit: int = 50
    ) -> list[Meeting]:
        """Add every occurrence of ``rule``; nothing is added if any occurrence clashes."""
        meetings = [self._make(title, day, start, end, attendees) for day in rule.occurrences(limit)]
        self._insert(meetings)
        return meetings

    def cancel(self, title: str, day: int) -> Meeting:
        for index, meeting in enumerate(self.meetings):
            if meeting.title == title and meeting.day == day:
                return self.meetings.pop(index)
        raise KeyError(f"no meeting {title!r} on day {day}")

    def on_day(self, day: int, person: str | None = None) -> list[Meeting]:
        """Meetings of ``day`` in start order, optionally only those ``person`` attends."""
        return [m for m in self.meetings if m.day == day and (person is None or person in m.attendees)]

    def busy(self, person: str, day: int) -> list[Interval]:
        return merge([m.slot for m in self.on_day(day, person)])

    def free_slots(self, person: str, day: int, min_length: int = 30) -> list[Interval]:
        """Free periods of at least ``min_length`` minutes within working hours."""
        gaps = subtract(self.hours, self.busy(person, day))
        return [gap for gap in gaps if gap.length >= min_length]

    def find_common_slot(self, people: list[str], day: int, duration: int, earliest: int = 0) -> Interval | None:
        """The earliest ``duration``-minute slot, starting at or after ``earliest``, free for everyone."""
        blocks = [slot for person in people for slot in self.busy(person, day)]
        start = max(self.hours.start, earliest)
        if start >= self.hours.end:
            return None
        for gap in subtract(Interval(start, self.hours.end), blocks):
            if gap.length >= duration:
                return Interval(gap.start, gap.start + duration)
        return None

    def utilization(self, person: str, day: int) -> float:
        """Fraction of the working day ``person`` spends in meetings."""
        return total_length(self.busy(person, day)) / self.hours.length
