import pytest
from geometry.polygon import Polygon, convex_hull, triangle_area
from geometry.shapes import BBox, Segment
from geometry.vector import Vec


def test_polygon_needs_three_vertices():
    with pytest.raises(ValueError):
        Polygon([Vec(0, 0), Vec(1, 0)])
    triangle = Polygon([Vec(0, 0), Vec(1, 0), Vec(0, 1)])
    assert len(triangle) == 3


def test_square_measurements():
    square = Polygon([Vec(0, 0), Vec(4, 0), Vec(4, 4), Vec(0, 4)])
    assert square.signed_area() == 16
    assert square.area() == 16
    assert square.is_clockwise() is False
    assert square.perimeter() == 16
    assert square.centroid() == Vec(2, 2)
    assert square.bbox() == BBox(0, 0, 4, 4)


def test_edges_wrap_around():
    square = Polygon([Vec(0, 0), Vec(4, 0), Vec(4, 4), Vec(0, 4)])
    edges = square.edges()
    assert len(edges) == 4
    assert edges[0] == Segment(Vec(0, 0), Vec(4, 0))
    assert edges[-1] == Segment(Vec(0, 4), Vec(0, 0))


def test_clockwise_polygon():
    square = Polygon([Vec(0, 4), Vec(4, 4), Vec(4, 0), Vec(0, 0)])
    assert square.signed_area() == -16
    assert square.area() == 16
    assert square.is_clockwise() is True
    assert square.centroid() == Vec(2, 2)


def test_l_shape_area_perimeter_centroid():
    shape = Polygon([Vec(0, 0), Vec(4, 0), Vec(4, 1), Vec(1, 1), Vec(1, 3), Vec(0, 3)])
    assert shape.area() == 6
    assert shape.perimeter() == 14
    centroid = shape.centroid()
    assert centroid.x == pytest.approx(1.5)
    assert centroid.y == pytest.approx(1.0)


def test_triangle_centroid():
    triangle = Polygon([Vec(0, 0), Vec(6, 0), Vec(0, 3)])
    assert triangle.area() == 9
    assert triangle.centroid() == Vec(2, 1)
    shifted = Polygon([Vec(1, 1), Vec(7, 1), Vec(1, 4)])
    assert shifted.centroid() == Vec(3, 2)


def test_degenerate_polygon_has_no_centroid():
    line = Polygon([Vec(0, 0), Vec(1, 1), Vec(2, 2)])
    assert line.area() == 0
    with pytest.raises(ValueError):
        line.centroid()


def test_contains_square():
    square = Polygon([Vec(0, 0), Vec(4, 0), Vec(4, 4), Vec(0, 4)])
    assert square.contains(Vec(2, 2))
    assert square.contains(Vec(3.9, 0.1))
    assert not square.contains(Vec(5, 2))
    assert not square.contains(Vec(-1, 2))
    assert not square.contains(Vec(2, 4.5))
    assert square.contains(Vec(4, 2))
    assert square.contains(Vec(0, 0))
    assert square.contains(Vec(2, 4 + 1e-10))
    assert not square.contains(Vec(2, 4.1), tol=0.05)
    assert square.contains(Vec(2, 4.1), tol=0.2)


def test_contains_concave_shape():
    shape = Polygon([Vec(0, 0), Vec(4, 0), Vec(4, 1), Vec(1, 1), Vec(1, 3), Vec(0, 3)])
    assert shape.contains(Vec(0.5, 2))
    assert shape.contains(Vec(3, 0.5))
    assert shape.contains(Vec(0.5, 1))
    assert not shape.contains(Vec(2, 2))
    assert not shape.contains(Vec(-1, 1))
    assert not shape.contains(Vec(5, 1))
    assert not shape.contains(Vec(-1, 3))
    assert not shape.contains(Vec(2, 3))
    assert not shape.contains(Vec(-1, 0))


def test_contains_triangle_vertex_rays():
    triangle = Polygon([Vec(0, 0), Vec(4, 2), Vec(0, 4)])
    assert triangle.contains(Vec(1, 2))
    assert not triangle.contains(Vec(-1, 2))
    assert not triangle.contains(Vec(5, 2))
    assert not triangle.contains(Vec(3, 3))
    assert triangle.contains(Vec(3, 2))


def test_is_convex():
    assert Polygon([Vec(0, 0), Vec(4, 0), Vec(4, 4), Vec(0, 4)]).is_convex()
    assert Polygon([Vec(0, 4), Vec(4, 4), Vec(4, 0), Vec(0, 0)]).is_convex()
    assert Polygon([Vec(0, 0), Vec(2, 0), Vec(4, 0), Vec(4, 4), Vec(0, 4)]).is_convex()
    shape = Polygon([Vec(0, 0), Vec(4, 0), Vec(4, 1), Vec(1, 1), Vec(1, 3), Vec(0, 3)])
    assert not shape.is_convex()
    assert not Polygon([Vec(0, 0), Vec(1, 1), Vec(2, 2)]).is_convex()


def test_is_convex_dart():
    dart = Polygon([Vec(0, 0), Vec(2, 1), Vec(4, 0), Vec(2, 4)])
    assert not dart.is_convex()
    kite = Polygon([Vec(0, 0), Vec(2, -1), Vec(4, 0), Vec(2, 4)])
    assert kite.is_convex()


def test_is_convex_larger_polygons():
    hexagon = Polygon([Vec(0, 0), Vec(2, -1), Vec(4, 0), Vec(4, 2), Vec(2, 3), Vec(0, 2)])
    assert hexagon.is_convex()
    arrow = Polygon([Vec(0, 0), Vec(4, 0), Vec(4, 4), Vec(2, 1), Vec(0, 4)])
    assert not arrow.is_convex()
    notch_bottom = Polygon([Vec(0, 0), Vec(3, 1), Vec(6, 0), Vec(6, 6), Vec(0, 6)])
    assert not notch_bottom.is_convex()
    notch_top = Polygon([Vec(0, 0), Vec(6, 0), Vec(6, 6), Vec(3, 5), Vec(0, 6)])
    assert not notch_top.is_convex()


def test_orientation_of_small_polygons():
    assert Polygon([Vec(0, 0), Vec(1, 0), Vec(0, 1)]).is_clockwise() is False
    assert Polygon([Vec(0, 0), Vec(0, 1), Vec(1, 0)]).is_clockwise() is True
    assert Polygon([Vec(0, 0), Vec(1, 1), Vec(2, 2)]).is_clockwise() is False


def test_translated():
    square = Polygon([Vec(0, 0), Vec(4, 0), Vec(4, 4), Vec(0, 4)])
    moved = square.translated(1, -2)
    assert moved.vertices == [Vec(1, -2), Vec(5, -2), Vec(5, 2), Vec(1, 2)]
    assert moved.area() == 16
    assert square.vertices[0] == Vec(0, 0)


def test_triangle_area():
    assert triangle_area(Vec(0, 0), Vec(4, 0), Vec(0, 3)) == 6
    assert triangle_area(Vec(0, 3), Vec(4, 0), Vec(0, 0)) == 6
    assert triangle_area(Vec(0, 0), Vec(1, 1), Vec(2, 2)) == 0
    assert triangle_area(Vec(1, 1), Vec(5, 1), Vec(1, 4)) == 6


def test_convex_hull():
    points = [Vec(2, 2), Vec(0, 0), Vec(2, 0), Vec(4, 0), Vec(4, 4), Vec(0, 4), Vec(1, 3), Vec(4, 4)]
    assert convex_hull(points) == [Vec(0, 0), Vec(4, 0), Vec(4, 4), Vec(0, 4)]


def test_convex_hull_irregular():
    points = [Vec(0, 0), Vec(5, 1), Vec(3, 2), Vec(6, 4), Vec(2, 5), Vec(-1, 3), Vec(1, 1)]
    assert convex_hull(points) == [Vec(-1, 3), Vec(0, 0), Vec(5, 1), Vec(6, 4), Vec(2, 5)]


def test_convex_hull_small_inputs():
    assert convex_hull([]) == []
    assert convex_hull([Vec(1, 1), Vec(1, 1)]) == [Vec(1, 1)]
    assert convex_hull([Vec(2, 2), Vec(0, 0)]) == [Vec(0, 0), Vec(2, 2)]
    assert convex_hull([Vec(0, 0), Vec(1, 1), Vec(2, 2)]) == [Vec(0, 0), Vec(2, 2)]
    assert convex_hull([Vec(0, 0), Vec(3, 0), Vec(0, 3)]) == [Vec(0, 0), Vec(3, 0), Vec(0, 3)]
