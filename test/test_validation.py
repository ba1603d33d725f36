"""The shared argument checks (``torchrl._validation``) and the ensemble member checks (``_members``)."""

from __future__ import annotations

import numpy as np
import pytest

from torchrl._validation import (
    check_bool,
    check_int,
    check_members,
    check_per_member,
    check_positive_int,
    is_int,
    is_real,
    member_at,
)


@pytest.mark.parametrize("value, expected", [(3, True), (np.int64(3), True), (True, False), (3.0, False), ("3", False)])
def test_is_int_takes_ints_and_numpy_integers_but_not_bools(value, expected):
    assert is_int(value) is expected


@pytest.mark.parametrize("value, expected", [(0.5, True), (2, True), (np.float32(1), True), (True, False), ("1", False)])
def test_is_real_takes_numbers_but_not_bools(value, expected):
    assert is_real(value) is expected


def test_check_int_returns_a_python_int_and_none_when_allowed():
    assert check_int("k", np.int32(4), minimum=0) == 4 and type(check_int("k", np.int32(4))) is int
    assert check_int("k", None, allow_none=True) is None


@pytest.mark.parametrize(
    "value, kwargs, error, message",
    [
        (True, {}, TypeError, r"^`k` must be a positive int, got True \(bool\)\.$"),
        (2.5, {"type_error": False}, ValueError, r"^`k` must be a positive int, got 2\.5 \(float\)\.$"),
        (0, {"hint": "Pass k=1."}, ValueError, r"^`k` must be a positive int, got 0\. Pass k=1\.$"),
        (None, {}, TypeError, r"^`k` must be a positive int, got None \(NoneType\)\.$"),
        (-1, {"allow_none": True}, ValueError, r"^`k` must be a positive int or None, got -1\.$"),
    ],
)
def test_errors_name_the_argument_show_the_value_and_the_fix(value, kwargs, error, message):
    with pytest.raises(error, match=message):
        check_positive_int("k", value, **kwargs)


@pytest.mark.parametrize("minimum, words", [(0, "a non-negative int"), (3, "an int >= 3"), (None, "an int")])
def test_check_int_says_the_bound(minimum, words):
    with pytest.raises((TypeError, ValueError), match=f"`k` must be {words}, got"):
        check_int("k", -5 if minimum is not None else "x", minimum=minimum)


def test_check_bool_refuses_ints():
    assert check_bool("flag", np.bool_(True)) is True
    with pytest.raises(TypeError, match=r"`flag` must be a bool, got 1 \(int\)\. Pass flag=True\."):
        check_bool("flag", 1, hint="Pass flag=True.")


def test_member_checks():
    assert check_members("Thing", (1, 2), int) == [1, 2]
    with pytest.raises(ValueError, match="at least one member int"):
        check_members("Thing", (), int)
    with pytest.raises(TypeError, match="Member 1 of a Thing must be a int, got str"):
        check_members("Thing", (1, "a"), int)
    with pytest.raises(ValueError, match=r"`fns` must have one entry per member \(2\), got 3"):
        check_per_member("fns", [None] * 3, 2)
    assert member_at("Thing", ["a", "b"], -1) == "b"
    with pytest.raises(IndexError, match="Member 2 is out of range for an ensemble of 2 members"):
        member_at("Thing", ["a", "b"], 2)
    with pytest.raises(TypeError, match=r"Index a Thing with an int \(a member\), got bool\. Read a member\."):
        member_at("Thing", ["a", "b"], True, hint="Read a member.")
