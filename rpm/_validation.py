"""Argument checks shared by the whole package (private).

One rule for every public constructor and function: a value of the wrong type raises
:class:`TypeError`, a value of the right type outside its range raises :class:`ValueError`, and
both messages name the argument, what it must be and what was given. ``bool`` is never accepted
as a number (``True`` is an ``int`` to Python, never a count or a scale to us). The checks return
the value as a plain Python ``int``, ``float``, ``bool`` or ``str`` so that callers can store it.

This module imports nothing heavy (no torch) so that the command line can use it while it
builds its parser.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from typing import Any

__all__ = [
    "check_bool",
    "check_choice",
    "check_int",
    "check_nonnegative",
    "check_positive",
    "check_positive_int",
    "check_positive_int_or_none",
    "check_probability",
    "check_real",
]


def _describe(value: Any) -> str:
    return f"{type(value).__name__} {value!r}"


def check_int(name: str, value: Any, minimum: int | None = None,
              maximum: int | None = None) -> int:
    """``value`` as an ``int`` after checking it is an integer (Python or NumPy, not ``bool``)
    in ``[minimum, maximum]`` (either bound may be ``None``).

    :raises TypeError: if ``value`` is not an integer.
    :raises ValueError: if it is outside the bounds.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {_describe(value)}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")
    return value


def check_positive_int(name: str, value: Any) -> int:
    """``value`` as an ``int`` after checking it is an integer >= 1 (a size or a count).

    :raises TypeError: if ``value`` is not an integer.
    :raises ValueError: if it is < 1 (the message says "a positive integer (>= 1)", the
        command line's wording).
    """
    value = check_int(name, value)
    if value < 1:
        raise ValueError(f"{name} must be a positive integer (>= 1), got {value}")
    return value


def check_positive_int_or_none(name: str, value: Any) -> int | None:
    """``None``, or ``value`` as an ``int`` after checking it is an integer >= 1 (an optional
    size: a block size, a round count, where ``None`` means "choose automatically").

    :raises TypeError: if ``value`` is neither ``None`` nor an integer.
    :raises ValueError: if it is < 1.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int or None, got {_describe(value)}")
    value = int(value)
    if value < 1:
        raise ValueError(f"{name} must be a positive integer (>= 1) or None, got {value}")
    return value


def _as_real(name: str, value: Any) -> float:
    if isinstance(value, bool):
        raise TypeError(f"{name} must be a number, got {_describe(value)}")
    if isinstance(value, numbers.Real):
        return float(value)
    # A one-element tensor or array (e.g. a learned parameter's current value).
    if getattr(value, "ndim", None) == 0 and callable(getattr(value, "item", None)):
        item = value.item()
        if not isinstance(item, bool) and isinstance(item, numbers.Real):
            return float(item)
    raise TypeError(f"{name} must be a number, got {_describe(value)}")


def check_real(name: str, value: Any, *, minimum: float | None = None,
               maximum: float | None = None, open_minimum: bool = False,
               finite: bool = True) -> float:
    """``value`` as a ``float`` after checking it is a real number (a Python or NumPy number,
    or a zero-dimensional tensor; not ``bool``), finite unless ``finite=False``, and at least
    ``minimum`` (strictly above it with ``open_minimum``) and at most ``maximum``.

    :raises TypeError: if ``value`` is not a real number.
    :raises ValueError: if it is NaN, infinite (with ``finite``) or outside the bounds.
    """
    number = _as_real(name, value)
    if math.isnan(number) or (finite and math.isinf(number)):
        raise ValueError(f"{name} must be a finite number, got {number}")
    if minimum is not None and (number <= minimum if open_minimum else number < minimum):
        raise ValueError(f"{name} must be {'>' if open_minimum else '>='} {minimum}, got {number}")
    if maximum is not None and number > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {number}")
    return number


def check_positive(name: str, value: Any) -> float:
    """``value`` as a ``float`` after checking it is a finite number > 0 (a scale, a rate, the
    initial value of a positive parameter)."""
    return check_real(name, value, minimum=0.0, open_minimum=True)


def check_nonnegative(name: str, value: Any) -> float:
    """``value`` as a ``float`` after checking it is a finite number >= 0."""
    return check_real(name, value, minimum=0.0)


def check_probability(name: str, value: Any) -> float:
    """``value`` as a ``float`` after checking it lies in the closed interval [0, 1]."""
    return check_real(name, value, minimum=0.0, maximum=1.0)


def check_bool(name: str, value: Any) -> bool:
    """``value`` after checking it is a ``bool`` (not merely truthy)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {_describe(value)}")
    return value


def check_choice(name: str, value: Any, choices: Iterable[str]) -> str:
    """``value`` after checking it is one of ``choices``."""
    choices = tuple(choices)
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")
    return value
