import math

import pytest
from geometry.vector import (
    EPSILON,
    Vec,
    angle_between,
    distance,
    lerp,
    manhattan,
    orientation,
)


def test_arithmetic():
    assert Vec(1, 2) + Vec(3, -1) == Vec(4, 1)
    assert Vec(1, 2) - Vec(3, -1) == Vec(-2, 3)
    assert Vec(1, 2) * 3 == Vec(3, 6)
    assert Vec(4, -2) * 0.5 == Vec(2, -1)


def test_dot_and_cross():
    assert Vec(1, 2).dot(Vec(3, 4)) == 11
    assert Vec(1, 2).cross(Vec(3, 4)) == -2
    assert Vec(1, 0).cross(Vec(0, 1)) == 1
    assert Vec(0, 1).cross(Vec(1, 0)) == -1


def test_length_and_normalized():
    assert Vec(3, 4).length() == 5.0
    assert Vec(0, 0).length() == 0.0
    assert Vec(3, 4).normalized() == Vec(0.6, 0.8)
    assert Vec(0, -2).normalized() == Vec(0, -1)
    assert Vec(EPSILON, 0).normalized() == Vec(1.0, 0.0)


def test_normalized_zero_vector():
    with pytest.raises(ValueError):
        Vec(0, 0).normalized()
    with pytest.raises(ValueError):
        Vec(1e-10, 0).normalized()


def test_rotated_quarter_turns():
    v = Vec(2, 1)
    assert v.rotated() == Vec(-1, 2)
    assert v.rotated(1) == Vec(-1, 2)
    assert v.rotated(2) == Vec(-2, -1)
    assert v.rotated(3) == Vec(1, -2)
    assert v.rotated(0) == v
    assert v.rotated(4) == v
    assert v.rotated(5) == Vec(-1, 2)
    assert v.rotated(-1) == Vec(1, -2)


def test_almost_equal():
    assert Vec(1, 1).almost_equal(Vec(1 + 5e-10, 1 - 5e-10))
    assert not Vec(1, 1).almost_equal(Vec(1.000001, 1))
    assert not Vec(0, 0).almost_equal(Vec(0, 5))
    assert not Vec(0, 0).almost_equal(Vec(5, 0))
    assert Vec(0, 0).almost_equal(Vec(0.1, -0.1), 0.1)
    assert not Vec(0, 0).almost_equal(Vec(0.1, -0.2), 0.1)


def test_distance_and_manhattan():
    assert distance(Vec(0, 0), Vec(3, 4)) == 5.0
    assert distance(Vec(1, 1), Vec(1, 1)) == 0.0
    assert manhattan(Vec(1, 1), Vec(4, -3)) == 7
    assert manhattan(Vec(-2, 5), Vec(-2, 5)) == 0


def test_lerp():
    a = Vec(0, 0)
    b = Vec(10, 20)
    assert lerp(a, b, 0.25) == Vec(2.5, 5.0)
    assert lerp(a, b, 0) == a
    assert lerp(a, b, 1) == b
    assert lerp(Vec(2, 2), Vec(4, 6), 1.5) == Vec(5, 8)


def test_orientation():
    assert orientation(Vec(0, 0), Vec(1, 0), Vec(1, 1)) == 1
    assert orientation(Vec(0, 0), Vec(1, 0), Vec(1, -1)) == -1
    assert orientation(Vec(0, 0), Vec(1, 1), Vec(3, 3)) == 0
    assert orientation(Vec(1, 0), Vec(0, 0), Vec(1, 1)) == -1


def test_orientation_tolerance():
    assert orientation(Vec(0, 0), Vec(1, 0), Vec(2, 1e-10)) == 0
    assert orientation(Vec(0, 0), Vec(1, 0), Vec(2, 1e-10), 0) == 1
    assert orientation(Vec(0, 0), Vec(1, 0), Vec(0, 0.5), 0.5) == 0
    assert orientation(Vec(0, 0), Vec(1, 0), Vec(0, -0.5), 0.5) == 0
    assert orientation(Vec(0, 0), Vec(1, 0), Vec(0, -0.5), 0.25) == -1


def test_angle_between():
    assert angle_between(Vec(1, 0), Vec(0, 1)) == pytest.approx(90)
    assert angle_between(Vec(0, 1), Vec(1, 0)) == pytest.approx(-90)
    assert angle_between(Vec(1, 0), Vec(-3, 0)) == pytest.approx(180)
    assert angle_between(Vec(1, 0), Vec(5, 0)) == pytest.approx(0)
    assert angle_between(Vec(1, 0), Vec(1, 1)) == pytest.approx(45)
    assert angle_between(Vec(1, 0), Vec(-1, -math.sqrt(3))) == pytest.approx(-120)


def test_angle_with_tiny_vectors():
    assert angle_between(Vec(EPSILON, 0), Vec(0, 1)) == pytest.approx(90)
    assert angle_between(Vec(0, 1), Vec(EPSILON, 0)) == pytest.approx(-90)


def test_angle_with_zero_vector():
    with pytest.raises(ValueError):
        angle_between(Vec(0, 0), Vec(1, 0))
    with pytest.raises(ValueError):
        angle_between(Vec(1, 0), Vec(0, 0))
