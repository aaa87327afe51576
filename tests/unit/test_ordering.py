"""make test's order of work (tests/ordering.py): longest first, TensorFlow tests alternating with the rest."""

import math

import pytest

from tests.ordering import interleave

pytestmark = pytest.mark.unit


def test_longest_first_and_unknown_before_all():
    assert interleave([(5.0, False), (math.inf, False), (50.0, False)]) == [1, 2, 0]


def test_cpu_bound_units_alternate_with_the_others_from_the_longest_on():
    # (duration, CPU-bound): three long trainings and waits; the four longest must not all train.
    units = [(288.0, True), (131.0, True), (122.0, False), (117.0, True), (62.0, False), (61.0, False), (7.0, True)]
    assert interleave(units) == [0, 2, 1, 4, 3, 5, 6]


def test_what_is_left_of_one_kind_runs_longest_first_after_the_other_kind_ran_out():
    assert interleave([(10.0, False), (9.0, False), (8.0, True), (1.0, False)]) == [0, 2, 1, 3]
