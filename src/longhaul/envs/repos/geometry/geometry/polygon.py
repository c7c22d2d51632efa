"""Simple polygons and convex hulls."""

from __future__ import annotations

from .shapes import BBox, Segment
from .vector import EPSILON, Vec, orientation


class Polygon:
    """A simple polygon given by its vertices in order (either winding)."""

    def __init__(self, vertices: list[Vec]) -> None:
        if len(vertices) < 3:
            raise ValueError("a polygon needs at least three vertices")
        self.vertices = list(vertices)

    def __len__(self) -> int:
        return len(self.vertices)

    def edges(self) -> list[Segment]:
        n = len(self.vertices)
        return [Segment(self.vertices[i], self.vertices[(i + 1) % n]) for i in range(n)]

    def signed_area(self) -> float:
        """Shoelace area: positive for counter-clockwise vertex order."""
        total = 0.0
        n = len(self.vertices)
        for i in range(n):
            a = self.vertices[i]
            b = self.vertices[(i + 1) % n]
            total += a.x * b.y - b.x * a.y
        return total / 2

    def area(self) -> float:
        return abs(self.signed_area())

    def is_clockwise(self) -> bool:
        return self.signed_area() < 0

    def perimeter(self) -> float:
        return sum(edge.length() for edge in self.edges())

    def centroid(self) -> Vec:
        """Centre of mass of the polygon's area."""
        area = self.signed_area()
        if abs(area) < EPSILON:
            raise ValueError("degenerate polygon has no centroid")
        cx = cy = 0.0
        n = len(self.vertices)
        for i in range(n):
            a = self.vertices[i]
            b = self.vertices[(i + 1) % n]
            factor = a.x * b.y - b.x * a.y
            cx += (a.x + b.x) * factor
            cy += (a.y + b.y) * factor
        return Vec(cx / (6 * area), cy / (6 * area))

    def bbox(self) -> BBox:
        return BBox.of_points(self.vertices)

    def contains(self, point: Vec, tol: float = EPSILON) -> bool:
        """Point-in-polygon by ray casting; points on the boundary count as inside."""
        if any(edge.contains(point, tol) for edge in self.edges()):
            return True
        inside = False
        n = len(self.vertices)
        j = n - 1
        for i in range(n):
            a = self.vertices[i]
            b = self.vertices[j]
            if (a.y > point.y) != (b.y > point.y):
                crossing_x = a.x + (point.y - a.y) * (b.x - a.x) / (b.y - a.y)
                if point.x < crossing_x:
                    inside = not inside
            j = i
        return inside

    def is_convex(self) -> bool:
        """True when all turns go the same way (collinear vertices are ignored)."""
        n = len(self.vertices)
        sign = 0
        for i in range(n):
            turn = orientation(self.vertices[i], self.vertices[(i + 1) % n], self.vertices[(i + 2) % n])
            if turn == 0:
                continue
            if sign == 0:
                sign = turn
            elif turn != sign:
                return False
        return sign != 0

    def translated(self, dx: float, dy: float) -> Polygon:
        return Polygon([Vec(v.x + dx, v.y + dy) for v in self.vertices])


def triangle_area(a: Vec, b: Vec, c: Vec) -> float:
    return abs((b - a).cross(c - a)) / 2


def convex_hull(points: list[Vec]) -> list[Vec]:
    """Counter-clockwise hull starting at the leftmost (then lowest) point, without collinear points."""
    unique = sorted(set(points), key=lambda p: (p.x, p.y))
    if len(unique) <= 2:
        return unique
    lower: list[Vec] = []
    for p in unique:
        while len(lower) >= 2 and orientation(lower[-2], lower[-1], p) <= 0:
            lower.pop()
        lower.append(p)
    upper: list[Vec] = []
    for p in reversed(unique):
        while len(upper) >= 2 and orientation(upper[-2], upper[-1], p) <= 0:
            upper.pop()
        upper.append(p)
    return lower[:-1] + upper[:-1]
