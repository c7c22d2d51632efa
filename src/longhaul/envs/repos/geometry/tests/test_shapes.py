import pytest
from geometry.shapes import BBox, Segment, segment_intersection
from geometry.vector import Vec


def test_segment_length_and_midpoint():
    seg = Segment(Vec(1, 1), Vec(4, 5))
    assert seg.length() == 5.0
    assert seg.midpoint() == Vec(2.5, 3.0)
    assert Segment(Vec(-2, 0), Vec(2, 6)).midpoint() == Vec(0, 3)


def test_closest_point_and_distance():
    seg = Segment(Vec(0, 0), Vec(4, 0))
    assert seg.closest_point(Vec(2, 3)) == Vec(2, 0)
    assert seg.closest_point(Vec(-1, 1)) == Vec(0, 0)
    assert seg.closest_point(Vec(6, -2)) == Vec(4, 0)
    assert seg.distance_to(Vec(2, 3)) == 3.0
    assert seg.distance_to(Vec(7, 4)) == 5.0
    diagonal = Segment(Vec(0, 0), Vec(2, 2))
    assert diagonal.closest_point(Vec(0, 2)) == Vec(1, 1)


def test_degenerate_segment():
    point = Segment(Vec(1, 1), Vec(1, 1))
    assert point.length() == 0.0
    assert point.closest_point(Vec(4, 5)) == Vec(1, 1)
    assert point.distance_to(Vec(4, 5)) == 5.0


def test_segment_contains():
    seg = Segment(Vec(0, 0), Vec(4, 0))
    assert seg.contains(Vec(2, 0))
    assert seg.contains(Vec(4, 0))
    assert seg.contains(Vec(2, 1e-10))
    assert not seg.contains(Vec(2, 1e-3))
    assert not seg.contains(Vec(5, 0))
    assert seg.contains(Vec(2, 0.5), 0.5)
    assert not seg.contains(Vec(2, 0.5), 0.25)


def test_intersection_crossing():
    first = Segment(Vec(0, 0), Vec(4, 4))
    second = Segment(Vec(0, 4), Vec(4, 0))
    assert segment_intersection(first, second) == Vec(2, 2)
    skew = Segment(Vec(0, 0), Vec(6, 3))
    assert segment_intersection(skew, Segment(Vec(4, 0), Vec(4, 4))) == Vec(4, 2)


def test_intersection_away_from_origin():
    first = Segment(Vec(1, 1), Vec(5, 5))
    second = Segment(Vec(1, 5), Vec(5, 1))
    assert segment_intersection(first, second) == Vec(3, 3)
    assert segment_intersection(Segment(Vec(2, 1), Vec(2, 9)), Segment(Vec(0, 4), Vec(6, 4))) == Vec(2, 4)
    assert segment_intersection(Segment(Vec(2, 1), Vec(2, 3)), Segment(Vec(0, 4), Vec(6, 4))) is None


def test_intersection_at_endpoints():
    assert segment_intersection(Segment(Vec(0, 0), Vec(4, 0)), Segment(Vec(2, 0), Vec(2, 5))) == Vec(2, 0)
    a = Segment(Vec(0, 0), Vec(2, 2))
    b = Segment(Vec(2, 2), Vec(3, 0))
    assert segment_intersection(a, b) == Vec(2, 2)
    assert segment_intersection(b, a) == Vec(2, 2)
    assert segment_intersection(a, b, tol=0) == Vec(2, 2)
    assert segment_intersection(b, a, tol=0) == Vec(2, 2)


def test_intersection_outside_segments():
    short = Segment(Vec(0, 0), Vec(1, 1))
    anti = Segment(Vec(0, 4), Vec(4, 0))
    assert segment_intersection(short, anti) is None
    assert segment_intersection(anti, short) is None
    assert segment_intersection(Segment(Vec(0, 0), Vec(4, 4)), Segment(Vec(3, 0), Vec(5, -2))) is None
    assert segment_intersection(Segment(Vec(3, 0), Vec(5, -2)), Segment(Vec(0, 0), Vec(4, 4))) is None


def test_intersection_parallel_and_collinear():
    base = Segment(Vec(0, 0), Vec(4, 0))
    assert segment_intersection(base, Segment(Vec(0, 1), Vec(4, 1))) is None
    assert segment_intersection(base, Segment(Vec(2, 0), Vec(6, 0))) == Vec(2, 0)
    assert segment_intersection(Segment(Vec(6, 0), Vec(2, 0)), base) == Vec(2, 0)
    assert segment_intersection(Segment(Vec(0, 0), Vec(1, 0)), Segment(Vec(2, 0), Vec(3, 0))) is None
    assert segment_intersection(Segment(Vec(0, 0), Vec(2, 0)), Segment(Vec(2, 0), Vec(3, 0))) == Vec(2, 0)
    vertical = Segment(Vec(0, 0), Vec(0, 4))
    assert segment_intersection(vertical, Segment(Vec(0, 6), Vec(0, 1))) == Vec(0, 1)


def test_bbox_validation_and_of_points():
    with pytest.raises(ValueError):
        BBox(2, 0, 1, 5)
    with pytest.raises(ValueError):
        BBox(0, 2, 5, 1)
    assert BBox(1, 1, 1, 1).area() == 0
    points = [Vec(1, 5), Vec(-2, 3), Vec(4, -1)]
    assert BBox.of_points(points) == BBox(-2, -1, 4, 5)
    with pytest.raises(ValueError):
        BBox.of_points([])


def test_bbox_measurements():
    box = BBox(0, 0, 4, 2)
    assert box.width == 4
    assert box.height == 2
    assert box.area() == 8
    assert box.center() == Vec(2, 1)
    assert BBox(-3, 1, 1, 7).center() == Vec(-1, 4)
    offset = BBox(1, 2, 4, 7)
    assert offset.width == 3
    assert offset.height == 5
    assert offset.area() == 15


def test_bbox_contains_inclusive_and_strict():
    box = BBox(0, 0, 4, 2)
    assert box.contains(Vec(1, 1))
    assert box.contains(Vec(1, 1), inclusive=False)
    for border in (Vec(0, 1), Vec(4, 1), Vec(2, 0), Vec(2, 2)):
        assert box.contains(border)
        assert not box.contains(border, inclusive=False)
    for outside in (Vec(-1, 1), Vec(5, 1), Vec(2, -1), Vec(2, 3)):
        assert not box.contains(outside)


def test_bbox_intersects():
    box = BBox(0, 0, 2, 2)
    assert box.intersects(BBox(1, 1, 3, 3))
    assert box.intersects(BBox(2, 0, 3, 1))
    assert box.intersects(BBox(-1, 0, 0, 1))
    assert box.intersects(BBox(0, 2, 1, 3))
    assert box.intersects(BBox(0, -1, 1, 0))
    assert not box.intersects(BBox(3, 0, 4, 1))
    assert not box.intersects(BBox(-2, 0, -1, 1))
    assert not box.intersects(BBox(0, 3, 1, 4))
    assert not box.intersects(BBox(0, -2, 1, -1))


def test_bbox_intersection_and_union():
    box = BBox(0, 0, 4, 4)
    assert box.intersection(BBox(2, 1, 6, 3)) == BBox(2, 1, 4, 3)
    assert BBox(2, 1, 6, 3).intersection(box) == BBox(2, 1, 4, 3)
    assert box.intersection(BBox(5, 5, 6, 6)) is None
    assert box.intersection(BBox(4, 1, 5, 2)) == BBox(4, 1, 4, 2)
    assert box.union(BBox(2, -1, 6, 3)) == BBox(0, -1, 6, 4)


def test_bbox_expanded():
    box = BBox(0, 0, 4, 4)
    assert box.expanded(1) == BBox(-1, -1, 5, 5)
    assert box.expanded(-1) == BBox(1, 1, 3, 3)
    assert BBox(0, 1, 4, 2).expanded(1) == BBox(-1, 0, 5, 3)
    with pytest.raises(ValueError):
        box.expanded(-3)
