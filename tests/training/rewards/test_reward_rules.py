"""The json_rules verifier: JSON extraction, schema, expected values, extra rules."""

from __future__ import annotations

import json

from training.rewards.rules import _MISSING, extract_json, json_equal, json_rules_reward, rule_problems, verify

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
META = {"schema": SCHEMA}
ANSWER = '{"name": "Bob", "age": 31}'


def test_extract_json_forms() -> None:
    assert extract_json('{"a": 1}') == {"a": 1}
    assert extract_json('Sure! ```json\n{"a": 1}\n``` done') == {"a": 1}
    assert extract_json('Here it is: {"a": {"b": 2}} thanks') == {"a": {"b": 2}}
    assert extract_json("[1, 2]") == [1, 2]
    assert extract_json("null") is None
    assert extract_json("no json") is _MISSING and extract_json("{broken") is _MISSING


def test_json_equal_is_strict_about_types() -> None:
    assert json_equal({"a": 1, "b": [1, 2]}, {"b": [1, 2], "a": 1.0})
    assert not json_equal({"a": True}, {"a": 1})
    assert not json_equal({"a": "31"}, {"a": 31})
    assert not json_equal([1, 2], [2, 1])
    assert not json_equal({"a": 1}, {"a": 1, "b": 2})


def test_verify_schema_and_values() -> None:
    assert verify('{"name": "Bob", "age": 31}', ANSWER, META)
    assert verify('{"age": 31, "name": "Bob"}', ANSWER, META)  # key order is irrelevant
    assert verify('The JSON: {"name": "Bob", "age": 31}.', ANSWER, META)
    assert not verify('{"name": "Bob", "age": "31"}', ANSWER, META)  # schema: age must be an integer
    assert not verify('{"name": "Bob", "age": 31, "x": 1}', ANSWER, META)  # additionalProperties
    assert not verify('{"name": "Bob"}', ANSWER, META)  # required
    assert not verify('{"name": "Bob", "age": 32}', ANSWER, META)  # wrong value
    assert not verify('{"name": "bob", "age": 31}', ANSWER, META)  # values are case-sensitive
    assert not verify("", ANSWER, META) and not verify("Bob is 31", ANSWER, META)


def test_rules() -> None:
    rules = [{"path": "contact.email", "regex": r"[^@\s]+@[^@\s]+\.\w+"}, {"path": "age", "min": 0, "max": 150}]
    ok = {"contact": {"email": "bob@x.io"}, "age": 31}
    assert rule_problems(ok, rules) == []
    assert rule_problems({"contact": {"email": "bob"}, "age": 31}, rules) == [
        "contact.email: 'bob' does not match '[^@\\\\s]+@[^@\\\\s]+\\\\.\\\\w+'"
    ]
    assert rule_problems({"age": 200}, rules) == ["contact.email: missing", "age: 200 violates max 150"]
    assert verify(json.dumps(ok), None, {"rules": rules})
    assert not verify('{"age": 31}', None, {"rules": rules})


def test_invalid_schema_verifies_nothing() -> None:
    assert not verify('{"a": 1}', '{"a": 1}', {"schema": {"type": "no-such-type"}})


def test_reward_fn_contract() -> None:
    out = json_rules_reward(
        ["p"] * 4,
        [ANSWER, '{"name": "Bob", "age": 30}', "x", ANSWER],
        answer=[ANSWER, ANSWER, ANSWER, None],
        metadata=[META, json.dumps(META), {}, {}],
        verifier=["json_rules", "json_rules", "json_rules", "math"],
    )
    assert out == [1.0, 0.0, 0.0, None]


def test_broken_rules_fail_closed() -> None:
    assert rule_problems({"a": "x"}, [{"path": "a", "regex": "("}]) == ["a: 'x' does not match '('"]
    assert rule_problems({"a": 1}, ["not a rule"]) == ["invalid rule 'not a rule'"]
