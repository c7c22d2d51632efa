"""Half-open integer intervals and operations on collections of them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class Interval:
    """The half-open range ``[start, end)`` of integer time units."""

    start: int
    end: int

    def __post_init__(self) -> None:
        if self.end < self.start:
            raise ValueError(f"interval ends before it starts: {self.start}..{self.end}")

    @property
    def length(self) -> int:
        return self.end - self.start

    def is_empty(self) -> bool:
        return self.length == 0

    def contains(self, point: int) -> bool:
        return self.start <= point < self.end

    def covers(self, other: Interval) -> bool:
        """True when ``other`` lies entirely inside this interval."""
        return self.start <= other.start and other.end <= self.end

    def overlaps(self, other: Interval) -> bool:
        """True when the intervals share at least one unit (touching is not overlapping)."""
        return self.start < other.end and other.start < self.end

    def intersection(self, other: Interval) -> Interval | None:
        start = max(self.start, other.start)
        end = min(self.end, other.end)
        if start < end:
            return Interval(start, end)
        return None

    def shifted(self, delta: int) -> Interval:
        return Interval(self.start + delta, self.end + delta)


def merge(intervals: list[Interval], gap: int = 0) -> list[Interval]:
    """Sort and merge intervals; ones separated by at most ``gap`` units are joined.

    Empty intervals are dropped. With the default ``gap`` touching intervals merge.
    """
    merged: list[Interval] = []
    for interval in sorted(intervals):
        if interval.is_empty():
            continue
        if merged and interval.start - merged[-1].end <= gap:
            last = merged[-1]
            merged[-1] = Interval(last.start, max(last.end, interval.end))
        else:
            merged.append(interval)
    return merged


def total_length(intervals: list[Interval]) -> int:
    """Units covered by at least one interval."""
    return sum(interval.length for interval in merge(intervals))


def subtract(base: Interval, blocks: list[Interval]) -> list[Interval]:
    """The parts of ``base`` not covered by any of ``blocks``, in order."""
    free: list[Interval] = []
    cursor = base.start
    for block in merge(blocks):
        if block.end <= cursor:
            continue
        if block.start >= base.end:
            break
        if block.start > cursor:
            free.append(Interval(cursor, block.start))
        cursor = block.end
    if cursor < base.end:
        free.append(Interval(cursor, base.end))
    return free


def max_overlap(intervals: list[Interval]) -> int:
    """Largest number of intervals active at the same instant.

    An interval ending at ``t`` does not overlap one starting at ``t``.
    """
    events: list[tuple[int, int]] = []
    for interval in intervals:
        if not interval.is_empty():
            events.append((interval.start, 1))
            events.append((interval.end, -1))
    events.sort()
    best = current = 0
    for _, delta in events:
        current += delta
        if current > best:
            best = current
    return best
