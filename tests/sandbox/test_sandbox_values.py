"""The value protocol: strict encoding in the job, strict decoding and comparison on the host."""

from __future__ import annotations

import json
import math

import pytest

from sandbox import TestCase, values_equal
from sandbox.harness import Unserialisable, encode
from sandbox.values import ProtocolError, decode, from_json, to_json


def roundtrip(value):
    return decode(json.loads(json.dumps(encode(value), allow_nan=False)))


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        False,
        0,
        -7,
        2**200,
        1.5,
        -0.0,
        "héllo\n\x00",
        [],
        [1, [2, [3]]],
        (),
        (1, "a", (2.5,)),
        {"a": 1},
        {1: "x", (1, 2): [3]},
        {1, 2, 3},
        frozenset({"a"}),
        b"\x00\xff",
        1 + 2j,
        {"$t": [1]},
    ],
)
def test_encode_decode_roundtrip_preserves_type_and_value(value):
    back = roundtrip(value)
    assert type(back) is type(value)
    assert back == value


def test_special_floats_roundtrip():
    assert roundtrip(math.inf) == math.inf
    assert roundtrip(-math.inf) == -math.inf
    assert math.isnan(roundtrip(math.nan))


@pytest.mark.parametrize(
    "value", [object(), 1.5j.__class__, type("I", (int,), {})(3), type("L", (list,), {})(), range(3), iter([1])]
)
def test_encode_refuses_anything_but_exact_plain_types(value):
    with pytest.raises(Unserialisable):
        encode(value)


def test_encode_limits_depth_and_size():
    deep: list = []
    for _ in range(200):
        deep = [deep]
    with pytest.raises(Unserialisable):
        encode(deep)
    with pytest.raises(Unserialisable):
        encode(list(range(2_000_000)))


@pytest.mark.parametrize(
    "node",
    [
        {"$x": 1},
        {"$t": 1},
        {"$f": "zero"},
        {"a": 1, "b": 2},
        {"$s": [[1]]},
        {"$d": [[[1], 2]]},
        {"$d": [[1]]},
        {"$b": "!!"},
        {"$c": [1, 2]},
    ],
)
def test_decode_rejects_malformed_nodes(node):
    with pytest.raises(ProtocolError):
        decode(node)


@pytest.mark.parametrize(
    "expected, actual, equal",
    [
        (5, 5, True),
        (5, 5.0, True),  # Python semantics: 5 == 5.0
        (True, 1, True),
        (0.1 + 0.2, 0.3, False),  # exact by default, like `assert f() == 0.3`
        ([1, 2], (1, 2), True),  # JSON tests cannot say "tuple": an expected list accepts a tuple
        ((1, 2), [1, 2], False),  # an expected tuple does not accept a list, exactly as Python would say
        ([1, [2, 3]], (1, (2, 3)), True),
        ({"a": [1, 2]}, {"a": (1, 2)}, True),
        ({"a": 1}, {"a": 1, "b": 2}, False),
        ({1, 2}, {2, 1}, True),
        ({1, 2}, frozenset({1, 2}), True),
        ({1, 2}, [1, 2], False),
        ([1, 2], [2, 1], False),
        ("abc", "abc", True),
        ("1", 1, False),
        (None, 0, False),
        (math.nan, math.nan, False),
        ([], {}, False),
        ({"a": {"b": [1.0]}}, {"a": {"b": [1]}}, True),
    ],
)
def test_values_equal(expected, actual, equal):
    assert values_equal(expected, actual) is equal


def test_values_equal_with_tolerances_recurses_into_containers():
    assert values_equal(0.3, 0.1 + 0.2, rel_tol=1e-9)
    assert values_equal([0.3, (1.0, 2.0)], [0.1 + 0.2, (1.0000001, 2.0)], abs_tol=1e-6)
    assert not values_equal([0.3], [0.31], abs_tol=1e-3)
    assert values_equal({"x": 2.0}, {"x": 2.0000000001}, rel_tol=1e-6)
    assert not values_equal(math.nan, math.nan, rel_tol=1.0)
    assert values_equal(3, 3.0000001, abs_tol=1e-3)


@pytest.mark.parametrize(
    "value", [(1, 2), {1, 2}, frozenset({3}), {1: "a"}, b"xy", 1j, math.inf, {"__set__": 1}, [(1, {2})], {"a": (1,)}]
)
def test_expected_values_roundtrip_through_plain_json(value):
    data = json.loads(json.dumps(to_json(value)))
    assert from_json(data) == value
    assert type(from_json(data)) is type(value)
    case = TestCase.from_dict(json.loads(json.dumps(TestCase("f()", value).to_dict())))
    assert case.expected == value


def test_plain_json_objects_stay_dicts():
    assert from_json({"a": [1, {"b": 2}]}) == {"a": [1, {"b": 2}]}
    with pytest.raises(ValueError):
        from_json({"__tuple__": 5})


def test_testcase_validates_call_and_expected():
    with pytest.raises(ValueError, match="not a Python expression"):
        TestCase("add(1,", 2)
    with pytest.raises(ValueError, match="expected"):
        TestCase("f()", object())
    with pytest.raises(ValueError, match="missing field 'expected'"):
        TestCase.from_dict({"call": "f()"}, "t")
    with pytest.raises(ValueError, match="unknown field"):
        TestCase.from_dict({"call": "f()", "expected": 1, "expect": 2}, "t")
