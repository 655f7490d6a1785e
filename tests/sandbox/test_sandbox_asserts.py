"""parse_assert_tests: MBPP/HumanEval assert lines -> TestCases on the host."""

from __future__ import annotations

import math

import pytest

from sandbox import TestCase, parse_assert_tests


def test_mbpp_style_lines():
    cases = parse_assert_tests(
        'assert remove_Occ("hello","l") == "heo"\n'
        "assert similar_elements((3, 4, 5, 6),(5, 7, 4, 10)) == (4, 5)\n"
        "assert set(f([1,2])) == set([2, 1])\n"
        "assert is_not_prime(2) == False\n"
        "assert heap([25, 35, -22], 2)==[-22, 25] , 'message'\n"
    )
    assert cases == [
        TestCase("remove_Occ('hello', 'l')", "heo"),  # calls are normalised by ast.unparse
        TestCase("similar_elements((3, 4, 5, 6), (5, 7, 4, 10))", (4, 5)),
        TestCase("set(f([1, 2]))", {1, 2}),
        TestCase("is_not_prime(2)", False),
        TestCase("heap([25, 35, -22], 2)", [-22, 25]),
    ]


def test_literal_on_the_left_and_special_literals():
    cases = parse_assert_tests(
        "assert 7 == f(3)\nassert g() == float('inf')\nassert h() == -2.5\n"
        "assert k() == math.pi\nassert m() == 2 ** 10\nassert n() == frozenset()\n"
    )
    assert [c.call for c in cases] == ["f(3)", "g()", "h()", "k()", "m()", "n()"]
    assert [c.expected for c in cases] == [7, math.inf, -2.5, math.pi, 1024, frozenset()]


def test_tolerance_forms():
    isclose, absdiff = parse_assert_tests(
        "assert math.isclose(area(2), 12.56, rel_tol=0.001)\nassert abs(candidate(1.33) - 0.33) < 1e-6\n"
    )
    assert (isclose.call, isclose.expected, isclose.rel_tol, isclose.abs_tol) == ("area(2)", 12.56, 0.001, 0.0)
    assert (absdiff.call, absdiff.expected, absdiff.abs_tol) == ("candidate(1.33)", 0.33, 1e-6)


def test_truthiness_and_identity_forms():
    cases = parse_assert_tests("assert is_prime(7)\nassert not is_prime(8)\nassert f() is None\nassert True\n")
    assert cases == [TestCase("bool(is_prime(7))", True), TestCase("bool(is_prime(8))", False), TestCase("f()", None)]


def test_imports_docstrings_and_pass_are_skipped():
    cases = parse_assert_tests('"""tests"""\nimport math\nfrom x import y\npass\nassert f(1) == 2\n')
    assert cases == [TestCase("f(1)", 2)]


def test_humaneval_check_function_with_entry_point():
    source = (
        "METADATA = {'author': 'jt'}\n\n"
        "def check(candidate):\n"
        "    assert candidate([1.0, 2.0, 3.0], 0.5) == False\n"
        "    assert abs(candidate(1.33) - 0.33) < 1e-6\n"
        "    assert True, 'This prints if this assert fails'\n"
    )
    cases = parse_assert_tests(source, entry_point="has_close_elements")
    assert [c.call for c in cases] == ["has_close_elements([1.0, 2.0, 3.0], 0.5)", "has_close_elements(1.33)"]


@pytest.mark.parametrize(
    "source, line, fragment",
    [
        ("assert f(1) == 2\nassert f(2) != 3\n", 2, "unsupported comparison NotEq"),
        ("assert f(1) == 2\nx = 5\nassert f(x) == 10\n", 2, "is not an assert"),
        ("assert f(1) == g(1)\n", 1, "neither side"),
        ("assert 1 < f(1) < 3\n", 1, "unsupported"),
        ("assert f(1) in [1, 2]\n", 1, "unsupported comparison In"),
        ("for i in range(3):\n    assert f(i) == i\n", 1, "is not an assert"),
        ("assert f(1) == 2\nassert f(2 == 3\n", 2, "not valid Python"),
    ],
)
def test_unsupported_lines_raise_naming_the_line(source, line, fragment):
    with pytest.raises(ValueError) as err:
        parse_assert_tests(source)
    assert f"line {line}" in str(err.value)
    assert fragment in str(err.value)


def test_no_asserts_is_an_error():
    with pytest.raises(ValueError, match="no assert"):
        parse_assert_tests("import math\n")


def test_parsed_cases_run_in_the_sandbox(pool):
    from sandbox import Job, Status

    program = "def similar_elements(a, b):\n    return tuple(sorted(set(a) & set(b)))\n"
    tests = parse_assert_tests(
        "assert similar_elements((3, 4, 5, 6),(5, 7, 4, 10)) == (4, 5)\n"
        "assert set(similar_elements((1, 2),(2, 3))) == set([2])\n"
    )
    verdict = pool.run(Job(program, tests))
    assert verdict.status is Status.PASSED, verdict
    # through JSON (how task sets store them) the tuple and set survive
    again = pool.run(Job(program, [TestCase.from_dict(t.to_dict()) for t in tests]))
    assert again.status is Status.PASSED, again
