"""The shared argument checks: the type rule (TypeError), the range rule (ValueError), bool never
a number, and the values they return."""

import math

import numpy as np
import pytest
import torch

from rpm._validation import (
    check_bool,
    check_choice,
    check_int,
    check_nonnegative,
    check_positive,
    check_positive_int,
    check_positive_int_or_none,
    check_probability,
    check_real,
)


def test_check_int_accepts_integers_and_returns_python_int():
    assert check_int("n", 3) == 3
    value = check_int("n", np.int64(7), minimum=0, maximum=7)
    assert value == 7 and type(value) is int
    assert check_positive_int("n", 1) == 1


@pytest.mark.parametrize("value", [True, 2.0, "3", None, torch.tensor(2)])
def test_check_int_refuses_other_types_with_a_type_error(value):
    with pytest.raises(TypeError, match=r"^size must be an int, got"):
        check_int("size", value)


@pytest.mark.parametrize("value, bounds, message", [
    (0, {"minimum": 1}, "size must be >= 1, got 0"),
    (5, {"maximum": 4}, "size must be <= 4, got 5"),
    (-1, {"minimum": 0, "maximum": 3}, "size must be >= 0, got -1"),
])
def test_check_int_refuses_values_out_of_range(value, bounds, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        check_int("size", value, **bounds)


def test_check_real_accepts_numbers_and_zero_dimensional_tensors():
    assert check_real("x", 2) == 2.0 and type(check_real("x", 2)) is float
    assert check_real("x", np.float32(0.5)) == 0.5
    assert check_real("x", torch.tensor(0.25, dtype=torch.float64)) == 0.25
    assert check_real("x", -math.inf, finite=False) == -math.inf
    assert check_positive("x", 1e-300) == 1e-300
    assert check_nonnegative("x", 0) == 0.0
    assert check_probability("p", 1) == 1.0


@pytest.mark.parametrize("value", [False, "1.0", None, torch.ones(2), [1.0]])
def test_check_real_refuses_other_types(value):
    with pytest.raises(TypeError, match="^scale must be a number, got"):
        check_real("scale", value)


@pytest.mark.parametrize("check, value, message", [
    (check_positive, 0.0, "scale must be > 0.0, got 0.0"),
    (check_positive, -2, "scale must be > 0.0, got -2.0"),
    (check_positive, math.inf, "scale must be a finite number, got inf"),
    (check_positive, math.nan, "scale must be a finite number, got nan"),
    (check_nonnegative, -1e-9, "scale must be >= 0.0, got -1e-09"),
    (check_probability, 1.5, "scale must be <= 1.0, got 1.5"),
])
def test_real_checks_refuse_values_out_of_range(check, value, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        check("scale", value)


def test_check_real_nan_is_refused_even_when_infinity_is_allowed():
    with pytest.raises(ValueError, match="finite"):
        check_real("x", math.nan, finite=False)


def test_check_bool_and_check_choice():
    assert check_bool("flag", False) is False
    with pytest.raises(TypeError, match="flag must be True or False, got int 1"):
        check_bool("flag", 1)
    assert check_choice("space", "box", ("sphere", "box")) == "box"
    with pytest.raises(ValueError, match="space must be one of 'sphere', 'box', got 'ball'"):
        check_choice("space", "ball", ("sphere", "box"))
    with pytest.raises(ValueError, match="space must be one of"):
        check_choice("space", ["box"], ("sphere", "box"))


def test_check_positive_int_says_positive_integer():
    with pytest.raises(ValueError, match=r"^dim must be a positive integer \(>= 1\), got 0$"):
        check_positive_int("dim", 0)
    with pytest.raises(TypeError, match="^dim must be an int, got float 2.5$"):
        check_positive_int("dim", 2.5)


def test_check_positive_int_or_none():
    assert check_positive_int_or_none("block", None) is None
    value = check_positive_int_or_none("block", np.int32(4))
    assert value == 4 and type(value) is int
    with pytest.raises(ValueError, match=r"^block must be a positive integer \(>= 1\) or None, got 0$"):
        check_positive_int_or_none("block", 0)
    for bad in (True, 2.0, "4"):
        with pytest.raises(TypeError, match="^block must be an int or None, got"):
            check_positive_int_or_none("block", bad)
