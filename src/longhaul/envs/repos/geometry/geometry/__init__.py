"""geometry: 2-D vectors, segments, boxes and polygons."""

from .polygon import Polygon, convex_hull, triangle_area
from .shapes import BBox, Segment, segment_intersection
from .vector import EPSILON, Vec, angle_between, distance, lerp, manhattan, orientation

__all__ = [
    "EPSILON",
    "BBox",
    "Polygon",
    "Segment",
    "Vec",
    "angle_between",
    "convex_hull",
    "distance",
    "lerp",
    "manhattan",
    "orientation",
    "segment_intersection",
    "triangle_area",
]
