"""scheduler: intervals, meeting calendars and recurring events on day numbers."""

from .intervals import Interval, max_overlap, merge, subtract, total_length
from .meetings import DAY_MINUTES, Calendar, ConflictError, Meeting
from .recurrence import WEEKDAYS, Recurrence, is_weekend, next_weekday, weekday

__all__ = [
    "DAY_MINUTES",
    "WEEKDAYS",
    "Calendar",
    "ConflictError",
    "Interval",
    "Meeting",
    "Recurrence",
    "is_weekend",
    "max_overlap",
    "merge",
    "next_weekday",
    "subtract",
    "total_length",
    "weekday",
]
