"""2-D vectors (also used as points) and basic predicates."""

from __future__ import annotations

import math
from dataclasses import dataclass

EPSILON = 1e-9


@dataclass(frozen=True)
class Vec:
    """An immutable 2-D vector."""

    x: float
    y: float

    def __add__(self, other: Vec) -> Vec:
        return Vec(self.x + other.x, self.y + other.y)

    def __sub__(self, other: Vec) -> Vec:
        return Vec(self.x - other.x, self.y - other.y)

    def __mul__(self, factor: float) -> Vec:
        return Vec(self.x * factor, self.y * factor)

    def dot(self, other: Vec) -> float:
        return self.x * other.x + self.y * other.y

    def cross(self, other: Vec) -> float:
        """z component of the 3-D cross product; positive when ``other`` is to the left."""
        return self.x * other.y - self.y * other.x

    def length(self) -> float:
        return math.hypot(self.x, self.y)

    def normalized(self) -> Vec:
        """Unit vector with the same direction."""
        size = self.length()
        if size < EPSILON:
            raise ValueError("cannot normalise a zero vector")
        return Vec(self.x / size, self.y / size)

    def rotated(self, quarter_turns: int = 1) -> Vec:
        """Rotate counter-clockwise by a multiple of 90 degrees (exactly)."""
        turns = quarter_turns % 4
        if turns == 0:
            return self
        if turns == 1:
            return Vec(-self.y, self.x)
        if turns == 2:
            return Vec(-self.x, -self.y)
        return Vec(self.y, -self.x)

    def almost_equal(self, other: Vec, tol: float = EPSILON) -> bool:
        return abs(self.x - other.x) <= tol and abs(self.y - other.y) <= tol


def distance(a: Vec, b: Vec) -> float:
    return (b - a).length()


def manhattan(a: Vec, b: Vec) -> float:
    return abs(b.x - a.x) + abs(b.y - a.y)


def lerp(a: Vec, b: Vec, t: float) -> Vec:
    """Point at fraction ``t`` of the way from ``a`` to ``b``."""
    return a + (b - a) * t


def orientation(a: Vec, b: Vec, c: Vec, tol: float = EPSILON) -> int:
    """1 if ``a, b, c`` turn left, -1 if they turn right, 0 if (nearly) collinear."""
    turn = (b - a).cross(c - a)
    if turn > tol:
        return 1
    if turn < -tol:
        return -1
    return 0


def angle_between(u: Vec, v: Vec) -> float:
    """Signed angle in degrees from ``u`` to ``v`` in the range (-180, 180]."""
    if u.length() < EPSILON or v.length() < EPSILON:
        raise ValueError("angle with a zero vector is undefined")
    return math.degrees(math.atan2(u.cross(v), u.dot(v)))
