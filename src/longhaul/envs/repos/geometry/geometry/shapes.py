"""Segments and axis-aligned bounding boxes."""

from __future__ import annotations

from dataclasses import dataclass

from .vector import EPSILON, Vec


@dataclass(frozen=True)
class Segment:
    start: Vec
    end: Vec

    def length(self) -> float:
        return (self.end - self.start).length()

    def midpoint(self) -> Vec:
        return Vec((self.start.x + self.end.x) / 2, (self.start.y + self.end.y) / 2)

    def closest_point(self, point: Vec) -> Vec:
        """The point of the segment nearest to ``point``."""
        direction = self.end - self.start
        squared = direction.dot(direction)
        if squared == 0:
            return self.start
        t = (point - self.start).dot(direction) / squared
        t = max(0.0, min(1.0, t))
        return self.start + direction * t

    def distance_to(self, point: Vec) -> float:
        return (point - self.closest_point(point)).length()

    def contains(self, point: Vec, tol: float = EPSILON) -> bool:
        """True when ``point`` lies on the segment (within ``tol``)."""
        return self.distance_to(point) <= tol


def segment_intersection(first: Segment, second: Segment, tol: float = EPSILON) -> Vec | None:
    """Intersection point of two segments, or ``None``.

    Overlapping collinear segments return the overlap endpoint with the
    smallest ``(x, y)``.
    """
    r = first.end - first.start
    s = second.end - second.start
    offset = second.start - first.start
    denominator = r.cross(s)
    if abs(denominator) <= tol:
        if abs(offset.cross(r)) > tol:
            return None
        ends = (first.start, first.end, second.start, second.end)
        shared = [p for p in ends if first.contains(p, tol) and second.contains(p, tol)]
        if not shared:
            return None
        return min(shared, key=lambda p: (p.x, p.y))
    t = offset.cross(s) / denominator
    u = offset.cross(r) / denominator
    if -tol <= t <= 1 + tol and -tol <= u <= 1 + tol:
        return first.start + r * t
    return None


@dataclass(frozen=True)
class BBox:
    """Axis-aligned box ``[min_x, max_x] x [min_y, max_y]``."""

    min_x: float
    min_y: float
    max_x: float
    max_y: float

    def __post_init__(self) -> None:
        if self.min_x > self.max_x or self.min_y > self.max_y:
            raise ValueError("box minimum exceeds maximum")

    @classmethod
    def of_points(cls, points: list[Vec]) -> BBox:
        if not points:
            raise ValueError("no points")
        xs = [p.x for p in points]
        ys = [p.y for p in points]
        return cls(min(xs), min(ys), max(xs), max(ys))

    @property
    def width(self) -> float:
        return self.max_x - self.min_x

    @property
    def height(self) -> float:
        return self.max_y - self.min_y

    def area(self) -> float:
        return self.width * self.height

    def center(self) -> Vec:
        return Vec((self.min_x + self.max_x) / 2, (self.min_y + self.max_y) / 2)

    def contains(self, point: Vec, inclusive: bool = True) -> bool:
        """Whether ``point`` is inside; the border counts only when ``inclusive``."""
        if inclusive:
            return self.min_x <= point.x <= self.max_x and self.min_y <= point.y <= self.max_y
        return self.min_x < point.x < self.max_x and self.min_y < point.y < self.max_y

    def intersects(self, other: BBox) -> bool:
        """True when the boxes share at least one point (touching counts)."""
        apart_x = other.min_x > self.max_x or other.max_x < self.min_x
        apart_y = other.min_y > self.max_y or other.max_y < self.min_y
        return not (apart_x or apart_y)

    def intersection(self, other: BBox) -> BBox | None:
        if not self.intersects(other):
            return None
        return BBox(
            max(self.min_x, other.min_x),
            max(self.min_y, other.min_y),
            min(self.max_x, other.max_x),
            min(self.max_y, other.max_y),
        )

    def union(self, other: BBox) -> BBox:
        return BBox(
            min(self.min_x, other.min_x),
            min(self.min_y, other.min_y),
            max(self.max_x, other.max_x),
            max(self.max_y, other.max_y),
        )

    def expanded(self, margin: float) -> BBox:
        """Grow (or, with a negative margin, shrink) the box on every side."""
        return BBox(self.min_x - margin, self.min_y - margin, self.max_x + margin, self.max_y + margin)
