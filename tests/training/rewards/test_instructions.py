"""The instruction-following verifier ("ifeval") on planted completions, and its generator."""

from __future__ import annotations

import pytest

from training.rewards import get_verifier, verify_tasks
from training.rewards.instructions import constraint_results
from training.tasksets.generators import generate
from training.tasksets.schema import Task


def _task(*constraints: dict) -> Task:
    return Task("if-1", "instruction", "p", "ifeval", metadata={"constraints": list(constraints)})


@pytest.mark.parametrize(
    "constraint, good, bad",
    [
        ({"id": "punctuation:no_comma"}, "red sun", "red, sun"),
        ({"id": "change_case:english_lowercase"}, "red sun", "Red sun"),
        ({"id": "change_case:english_capital"}, "RED SUN", "RED sun"),
        ({"id": "length_constraints:number_words", "relation": "less than", "num_words": 3}, "a b", "a b c"),
        ({"id": "length_constraints:number_words", "relation": "at least", "num_words": 3}, "a b c", "a b"),
        ({"id": "keywords:existence", "keywords": ["red", "sun"]}, "Sun and RED", "red moon"),
        ({"id": "keywords:forbidden_words", "forbidden_words": ["cat"]}, "catalogue", "a cat"),
        ({"id": "startend:end_checker", "end_phrase": "JAM"}, "SUN JAM \n", "JAM SUN"),
        ({"id": "detectable_format:json_format", "keys": ["a", "b"]}, '{"b": 1, "a": 2}', '{"a": 1}'),
        ({"id": "detectable_format:json_format"}, " [1, 2] ", "[1, 2"),
        ({"id": "detectable_format:json_format"}, '```json\n{"a": 1}\n```', '```{"a": 1'),
        # IFEval checks this project does not implement itself: they come from the if-verifiable package
        ({"id": "startend:quotation"}, '"red sun"', "red sun"),
        ({"id": "detectable_format:number_bullet_lists", "num_bullets": 2}, "* red\n* sun", "* red"),
        (
            {"id": "keywords:letter_frequency", "letter": "a", "let_frequency": 3, "let_relation": "at least"},
            "a banana",
            "a bee",
        ),
    ],
)
def test_each_constraint_on_planted_completions(constraint, good, bad) -> None:
    assert constraint_results([constraint], good) == [True]
    assert constraint_results([constraint], bad) == [False]


def test_case_checks_do_not_depend_on_language_detection() -> None:
    """IFEval's own case checks also ask langdetect for "en", which it is not for a few short words."""
    import langdetect

    langdetect.DetectorFactory.seed = 0
    assert langdetect.detect("red sun cat") != "en"  # what IFEval's check would have failed on
    assert constraint_results([{"id": "change_case:english_lowercase"}], "red sun cat") == [True]
    assert constraint_results([{"id": "change_case:english_capital"}], "OWL FIG ICE") == [True]


def test_all_constraints_must_hold_and_explain_names_the_broken_ones() -> None:
    task = _task(
        {"id": "keywords:existence", "keywords": ["red", "sun"]},
        {"id": "change_case:english_capital"},
        {"id": "punctuation:no_comma"},
    )
    completions = ["RED SUN", "RED, SUN", "red sun", "", "RED"]
    v = get_verifier("ifeval")
    assert v.score([task] * 5, completions) == [1.0, 0.0, 0.0, 0.0, 0.0]
    assert v.explain([task] * 5, completions) == [
        "",
        "not followed: punctuation:no_comma",
        "not followed: change_case:english_capital",
        "empty response",
        "not followed: keywords:existence",
    ]
    assert [v.format_ok(task, c) for c in completions] == [True, True, True, False, True]


def test_format_rate_for_json_constraints() -> None:
    task = _task({"id": "detectable_format:json_format", "keys": ["box", "egg"]})
    v = get_verifier("ifeval")
    assert v.format_ok(task, '{"box": "oak"}') and not v.format_ok(task, '{"box": oak}')
    assert v.score([task], ['{"box": "oak"}']) == [0.0]  # valid JSON (format ok), wrong keys (fails)
    assert verify_tasks([task], ['{"box":"oak","egg":"kit"}'], strict=True) == [True]


def test_row_problems() -> None:
    v = get_verifier("ifeval")
    assert (
        v.row_problems(None, [], {})
        and "unknown constraint" in v.row_problems(None, [], {"constraints": [{"id": "poetry:rhymes"}]})[0][1]
    )
    assert v.row_problems(None, [], {"constraints": [{"id": "punctuation:no_comma"}]}) == []
    # IFEval draws a missing kwarg at random; a task must say it
    problem = v.row_problems(None, [], {"constraints": [{"id": "length_constraints:number_words", "num_words": 3}]})
    assert problem and "relation" in problem[0][1]


def test_generated_tasks_every_level_references_pass_and_combine_constraints() -> None:
    tasks = generate("instruction", 100, seed=0)
    assert all(verify_tasks(tasks, [t.reference for t in tasks]))
    n_constraints = {t.difficulty: len(t.metadata["constraints"]) for t in tasks}
    assert n_constraints == {1: 2, 2: 3, 3: 4, 4: 2, 5: 5}
    harder = [t for t in tasks if t.difficulty >= 2]  # every level from 2 forbids commas or asks for JSON
    assert not any(verify_tasks(harder, [t.reference.replace(" ", ", ") + "," for t in harder]))
