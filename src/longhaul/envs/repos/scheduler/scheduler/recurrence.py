"""Recurring events on integer day numbers (day 0 is a Monday)."""

from __future__ import annotations

from dataclasses import dataclass

WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")


def weekday(day: int) -> str:
    return WEEKDAYS[day % 7]


def is_weekend(day: int) -> bool:
    return day % 7 >= 5


def next_weekday(day: int, name: str) -> int:
    """The first day on or after ``day`` that falls on weekday ``name``."""
    target = WEEKDAYS.index(name)
    return day + (target - day) % 7


@dataclass(frozen=True)
class Recurrence:
    """Every ``every`` days from ``start_day``, limited by ``count`` and/or ``until``.

    ``count`` limits the generated slots, including weekend slots dropped by
    ``skip_weekends``; ``until`` is the last permitted day (inclusive).
    """

    start_day: int
    every: int = 1
    count: int | None = None
    until: int | None = None
    skip_weekends: bool = False

    def __post_init__(self) -> None:
        if self.every < 1:
            raise ValueError("every must be at least 1")
        if self.count is not None and self.count < 0:
            raise ValueError("count must not be negative")
        if self.skip_weekends and self.every % 7 == 0 and is_weekend(self.start_day):
            raise ValueError("recurrence would never occur")

    def _slot(self, index: int) -> int | None:
        """Day of slot ``index`` or ``None`` when the series has ended."""
        if self.count is not None and index >= self.count:
            return None
        day = self.start_day + index * self.every
        if self.until is not None and day > self.until:
            return None
        return day

    def occurrences(self, limit: int = 50) -> list[int]:
        """Occurrence days in order, at most ``limit`` of them."""
        days: list[int] = []
        index = 0
        while len(days) < limit:
            day = self._slot(index)
            if day is None:
                break
            index += 1
            if self.skip_weekends and is_weekend(day):
                continue
            days.append(day)
        return days

    def occurs_on(self, day: int) -> bool:
        offset = day - self.start_day
        if offset < 0 or offset % self.every != 0:
            return False
        if self._slot(offset // self.every) is None:
            return False
        return not (self.skip_weekends and is_weekend(day))

    def next_after(self, day: int) -> int | None:
        """The first occurrence strictly after ``day``, or ``None``."""
        index = 0
        if day >= self.start_day:
            index = (day - self.start_day) // self.every + 1
        while True:
            candidate = self._slot(index)
            if candidate is None:
                return None
            if not (self.skip_weekends and is_weekend(candidate)):
                return candidate
            index += 1
