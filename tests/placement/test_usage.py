"""Decayed usage: exact levels against the closed form."""

import math

import pytest

from longhaul.placement.usage import Usage


def test_level_is_the_decayed_mean_of_what_was_held():
    u = Usage(half_life_s=3600.0)
    u.acquire("a", 0.5, 0.0)
    assert u.level("a", 0.0) == 0.0  # nothing in the past yet, and no lookahead
    # held 0.5 for one half-life: the mean over the decayed past is 0.5 * (1 - 1/2)
    assert u.level("a", 3600.0) == pytest.approx(0.25, rel=1e-12)
    u.release("a", 0.5, 3600.0)
    assert u.level("a", 3600.0) == pytest.approx(0.25, rel=1e-12)
    assert u.level("a", 7200.0) == pytest.approx(0.125, rel=1e-12)  # halves every half-life
    assert u.level("b", 7200.0) == 0.0


def test_what_is_held_now_counts_lookahead_seconds_ahead():
    tau = 60.0 / math.log(2)
    u = Usage(half_life_s=60.0, lookahead_s=30.0)
    u.acquire("a", 0.3, 0.0)
    assert u.level("a", 0.0) == pytest.approx(0.3 * 30.0 / tau, rel=1e-12)
    assert u.level("a", tau) == pytest.approx(0.3 * (1 - math.exp(-1)) + 0.3 * 30.0 / tau, rel=1e-12)  # one time constant
    assert u.level("a", 6000.0) == pytest.approx(0.3 + 0.3 * 30.0 / tau, rel=1e-9)  # a long hold: its share


def test_without_a_half_life_only_the_share_held_now_counts():
    u = Usage(half_life_s=None, lookahead_s=600.0)
    u.acquire("a", 0.5, 0.0)
    assert u.level("a", 1e6) == 0.5
    u.release("a", 0.5, 2e6)
    assert u.level("a", 2e6) == 0.0
