"""Tiny-profile task generators: short, regular, verifiable tasks in four domains, deterministic by seed.

    generate("math", n=1000, seed=0, difficulties=(1, 2, 3)) -> [Task(id="math-0-0", ...), ...]

Sized for a ~0.4M-parameter GPT-2 trained from scratch with a byte-level BPE: prompts under 60 characters,
references under 42, one surface form per template. Difficulty 1 is learnable by SFT alone; 5 is hard.

- math (verifier "math"): `Q: 23+45=? A:` -> reference and answer `68`.
    1: one-digit a+b   2: two-digit ± one-digit (and one-digit + two-digit)   3: two-digit ± two-digit, one-digit a*b
    4: three-digit ± three-digit, two-digit * one-digit   5: two steps ((a+b)*c, a*b-c, ...), two-digit products
- code (verifier "code"): `Write f(x) returning x plus 3.` -> reference `def f(x): return x+3`, 4 tests
    ({"call": "f(2)", "expected": 5}), the first 2 also in metadata["visible_tests"] (what a repair episode runs
    and shows). No program prefix: the completion is the whole program.
    1: x op k   2: x*k1+k2, (x+k1)*k2   3: string ops   4: list ops   5: prompts with two readings that only the
    tests settle ("x shifted by 7": plus or minus; "s cut by 3": which end; "an extreme of xs": max or min), so
    a first attempt fails about half the time and the visible test's failure ("f(2): expected 9, got -5") tells
    the fix; the first visible test always tells the two readings apart
- extraction (verifier "json_rules"): `Extract name and age as JSON: Bob is 31.` ->
    `{"name":"Bob","age":31}` (compact JSON; any formatting verifies), metadata {"schema": ...} (a closed
    object with typed fields).
    1: one field   2: name+age   3: other fields, swapped order   4: three fields   5: a list, or a derived year

- instruction (verifier "ifeval", training/rewards/instructions.py): several verifiable constraints at once,
    `Say red sun in caps, no commas.` -> `RED SUN`, metadata {"constraints": [{"id": "keywords:existence",
    "keywords": ["red", "sun"]}, {"id": "change_case:english_capital"}, {"id": "punctuation:no_comma"}]}.
    The reference satisfies every constraint; any completion that does passes.
    1: two words, one case constraint   2: three words, no commas, lowercase   3: + under N words
    4: JSON with given keys and values   5: caps, no commas, ending with a given word, under N words

Item i gets difficulty `difficulties[i % len(difficulties)]` (balanced for stratified splits) and id
`<domain>-<seed>-<i>`. A generator retries a few times to avoid repeating a prompt within one call, so the
first n tasks of a call do not depend on n (stable ids), and small difficulty levels whose template space is
exhausted (math difficulty 1 has 100 distinct prompts) yield duplicates that the dedup step removes.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

from training.tasksets.schema import MAX_DIFFICULTY, MIN_DIFFICULTY, Task

DOMAIN_VERIFIER = {"math": "math", "code": "code", "extraction": "json_rules", "instruction": "ifeval"}
_RETRIES = 8
VISIBLE_CODE_TESTS = 2  # of a generated code task's 4 tests, the ones shown in an episode (metadata.visible_tests)


# ----- math ---------------------------------------------------------------------------------------------------
def _math(rng: random.Random, level: int) -> tuple[str, int]:
    r = rng.randint
    if level == 1:
        a, b = r(0, 9), r(0, 9)
        return f"{a}+{b}", a + b
    if level == 2:
        a, b = r(10, 99), r(0, 9)
        kind = r(0, 2)
        return (f"{a}+{b}", a + b) if kind == 0 else (f"{b}+{a}", a + b) if kind == 1 else (f"{a}-{b}", a - b)
    if level == 3:
        roll = rng.random()
        if roll < 0.4:
            a, b = r(10, 99), r(10, 99)
            return f"{a}+{b}", a + b
        if roll < 0.8:
            a, b = r(10, 99), r(10, 99)
            return f"{a}-{b}", a - b
        a, b = r(2, 9), r(2, 9)
        return f"{a}*{b}", a * b
    if level == 4:
        roll = rng.random()
        if roll < 0.35:
            a, b = r(100, 999), r(100, 999)
            return f"{a}+{b}", a + b
        if roll < 0.7:
            a, b = r(100, 999), r(100, 999)
            return f"{a}-{b}", a - b
        a, b = r(10, 99), r(2, 9)
        return f"{a}*{b}", a * b
    a, b, c = r(2, 19), r(2, 19), r(2, 9)
    kind = r(0, 4)
    if kind == 0:
        return f"({a}+{b})*{c}", (a + b) * c
    if kind == 1:
        return f"{a}*{c}-{b}", a * c - b
    if kind == 2:
        return f"{a}+{b}*{c}", a + b * c
    if kind == 3:
        return f"{a}*{b}+{c}", a * b + c
    a, b = r(10, 99), r(10, 99)
    return f"{a}*{b}", a * b


def _math_task(rng: random.Random, level: int) -> tuple[str, Callable[[], dict[str, Any]]]:
    expr, value = _math(rng, level)
    prompt = f"Q: {expr}=? A:"
    return prompt, lambda: {"prompt": prompt, "reference": str(value), "answer": str(value)}


# ----- code ---------------------------------------------------------------------------------------------------
# (prompt, body, python function for the expected values, argument kind); `{v}` is the variable, `{k}` a constant.
_Tpl = tuple[str, str, Callable[..., Callable[..., Any]], str]
_CODE: dict[int, list[_Tpl]] = {
    1: [
        ("{v} plus {k}", "{v}+{k}", lambda k: lambda x: x + k, "int"),
        ("{v} minus {k}", "{v}-{k}", lambda k: lambda x: x - k, "int"),
        ("{v} times {k}", "{v}*{k}", lambda k: lambda x: x * k, "int"),
    ],
    2: [
        ("{v} times {k2} plus {k}", "{v}*{k2}+{k}", lambda k, k2: lambda x: x * k2 + k, "int"),
        ("({v} plus {k}) times {k2}", "({v}+{k})*{k2}", lambda k, k2: lambda x: (x + k) * k2, "int"),
        ("{v} times {k2} minus {k}", "{v}*{k2}-{k}", lambda k, k2: lambda x: x * k2 - k, "int"),
    ],
    3: [
        ("{v} repeated {k2} times", "{v}*{k2}", lambda k2: lambda s: s * k2, "str"),
        ("the first {k2} chars of {v}", "{v}[:{k2}]", lambda k2: lambda s: s[:k2], "str"),
        ("the last {k2} chars of {v}", "{v}[-{k2}:]", lambda k2: lambda s: s[-k2:], "str"),
        ("{v} with '{C}' appended", "{v}+'{C}'", lambda C: lambda s: s + C, "str"),
        ("{v} with '{C}' prepended", "'{C}'+{v}", lambda C: lambda s: C + s, "str"),
        ("{v} joined by '{C}'", "'{C}'.join({v})", lambda C: lambda s: C.join(s), "str"),
        ("the count of '{c}' in {v}", "{v}.count('{c}')", lambda c: lambda s: s.count(c), "str"),
        ("{v} reversed", "{v}[::-1]", lambda: lambda s: s[::-1], "str"),
        ("{v} in upper case", "{v}.upper()", lambda: lambda s: s.upper(), "str"),
        ("the length of {v}", "len({v})", lambda: lambda s: len(s), "str"),
        ("{v} with every '{c}' removed", "{v}.replace('{c}','')", lambda c: lambda s: s.replace(c, ""), "str"),
        ("{v} without its first {k2} chars", "{v}[{k2}:]", lambda k2: lambda s: s[k2:], "str"),
        ("whether {v} starts with '{c}'", "{v}.startswith('{c}')", lambda c: lambda s: s.startswith(c), "str"),
        ("whether '{c}' is in {v}", "'{c}' in {v}", lambda c: lambda s: c in s, "str"),
        ("{v} doubled", "{v}+{v}", lambda: lambda s: s + s, "str"),
    ],
    4: [
        ("the sum of {v} plus {k}", "sum({v})+{k}", lambda k: lambda xs: sum(xs) + k, "list"),
        ("the max of {v} times {k2}", "max({v})*{k2}", lambda k2: lambda xs: max(xs) * k2, "list"),
        ("the min of {v} minus {k}", "min({v})-{k}", lambda k: lambda xs: min(xs) - k, "list"),
        ("the length of {v} plus {k}", "len({v})+{k}", lambda k: lambda xs: len(xs) + k, "list"),
        ("each item of {v} plus {k}", "[i+{k} for i in {v}]", lambda k: lambda xs: [i + k for i in xs], "list"),
        (
            "the items of {v} above {k2}",
            "[i for i in {v} if i>{k2}]",
            lambda k2: lambda xs: [i for i in xs if i > k2],
            "list",
        ),
        ("{v} sorted", "sorted({v})", lambda: lambda xs: sorted(xs), "list"),
    ],
    5: [
        # Specified only by their tests: each prompt has two readings, the task's hidden choice is one of them
        # (a first attempt is right about half the time), and a failed visible test names what was expected,
        # which tells which reading it is. Repair is learnable here; a first attempt cannot do better. The
        # constants are one digit: a repair turn copies the constant across an error message whose own numbers
        # compete with it, and the tiny model garbled two-digit ones there (x-62 -> x+6; benchmarks/multiturn.py).
        ("{v} shifted by {k2}", "{v}+{k2}", lambda k2: lambda x: x + k2, "int"),
        ("{v} shifted by {k2}", "{v}-{k2}", lambda k2: lambda x: x - k2, "int"),
        ("{v} scaled by {k2}", "{v}*{k2}", lambda k2: lambda x: x * k2, "int"),
        ("{v} scaled by {k2}", "{v}//{k2}", lambda k2: lambda x: x // k2, "int"),
        ("{v} cut by {k2}", "{v}[{k2}:]", lambda k2: lambda s: s[k2:], "str"),
        ("{v} cut by {k2}", "{v}[:-{k2}]", lambda k2: lambda s: s[:-k2], "str"),
        ("{v} in one case", "{v}.upper()", lambda: lambda s: s.upper(), "str"),
        ("{v} in one case", "{v}.lower()", lambda: lambda s: s.lower(), "str"),
        ("{v} ordered", "sorted({v})", lambda: lambda xs: sorted(xs), "list"),
        ("{v} ordered", "sorted({v},reverse=True)", lambda: lambda xs: sorted(xs, reverse=True), "list"),
        ("an extreme of {v}", "max({v})", lambda: lambda xs: max(xs), "list"),
        ("an extreme of {v}", "min({v})", lambda: lambda xs: min(xs), "list"),
        ("{v} stepped by {k2}", "{v}+{k2}", lambda k2: lambda x: x + k2, "int"),
        ("{v} stepped by {k2}", "{v}-{k2}", lambda k2: lambda x: x - k2, "int"),
        ("{v} resized by {k2}", "{v}*{k2}", lambda k2: lambda x: x * k2, "int"),
        ("{v} resized by {k2}", "{v}//{k2}", lambda k2: lambda x: x // k2, "int"),
        ("{v} trimmed by {k2}", "{v}[{k2}:]", lambda k2: lambda s: s[k2:], "str"),
        ("{v} trimmed by {k2}", "{v}[:-{k2}]", lambda k2: lambda s: s[:-k2], "str"),
    ],
}
_VARS = {
    "int": ("x", "n", "a", "y", "k", "m"),
    "str": ("s", "t", "w", "u", "z"),
    "list": ("xs", "ys", "ns", "vs", "ws"),
}
_LETTERS = "abcdef"  # test strings are made of these, so count/startswith/in tests are not all-False
_ALPHABET = "abcdefghijklmnopqrstuvwxyz-_.*#"


def _code_args(rng: random.Random, kind: str, longest: int = 6) -> list[tuple[Any, ...]]:
    if kind == "int":
        return [(v,) for v in rng.sample(range(-9, 30), 4)]
    if kind == "str":
        return [("".join(rng.choice(_LETTERS) for _ in range(rng.randint(0 if i else 1, longest))),) for i in range(4)]
    return [([rng.randint(-5, 20) for _ in range(rng.randint(1, 5))],) for _ in range(4)]  # "list"


def _code_task(rng: random.Random, level: int) -> tuple[str, Callable[[], dict[str, Any]]]:
    prompt_t, body_t, make, kind = rng.choice(_CODE[level])
    var = rng.choice(_VARS[kind])
    k, k2 = rng.randint(1, 99), rng.randint(2, 9)  # in this order: the draws fix every task after them
    params: dict[str, Any] = {"k": k, "k2": k2, "c": rng.choice(_LETTERS), "C": rng.choice(_ALPHABET)}
    fill = dict(params, v=var)
    prompt = f"Write f({var}) returning {prompt_t.format(**fill)}."

    def finish() -> dict[str, Any]:  # only for prompts not seen yet: the tests are the costly part
        fn, others = (
            _function(make, params),
            [_function(m, params) for p, b, m, _ in _CODE[level] if p == prompt_t and b != body_t],
        )
        args = _code_args(rng, kind)
        if others:  # a prompt with two readings: the first (visible) test must tell them apart, or no failure
            longest = max(6, k2 + 3)  # can say which reading was meant ("cut by 8" needs 9+ chars)
            for _ in range(50):
                if all(fn(*args[0]) != other(*args[0]) for other in others):
                    break
                args = _code_args(rng, kind, longest)
        tests = [{"call": f"f({', '.join(repr(a) for a in arg)})", "expected": fn(*arg)} for arg in args]
        # the first two are visible (an environment runs them and shows the result); all four are hidden
        return {
            "prompt": prompt,
            "reference": f"def f({var}): return {body_t.format(**fill)}",
            "tests": tests,
            "metadata": {"visible_tests": tests[:VISIBLE_CODE_TESTS]},
        }

    return prompt, finish


def _function(make: Callable[..., Callable[..., Any]], params: dict[str, Any]) -> Callable[..., Any]:
    """A template's python function for these parameters (`make` names the ones it takes)."""
    return make(*(params[n] for n in make.__code__.co_varnames[: make.__code__.co_argcount]))


# ----- extraction ---------------------------------------------------------------------------------------------
_NAMES = (
    "Bob",
    "Ann",
    "Eve",
    "Tom",
    "Sam",
    "Max",
    "Zoe",
    "Ida",
    "Leo",
    "Mia",
    "Ben",
    "Amy",
    "Dan",
    "Kim",
    "Joe",
    "Liz",
    "Ray",
    "Una",
    "Vic",
    "Wes",
    "Ada",
    "Cal",
    "Dee",
    "Fay",
    "Gus",
    "Hal",
    "Ivy",
    "Jan",
    "Ali",
    "Bea",
    "Cy",
    "Dot",
    "Eli",
    "Flo",
    "Gil",
    "Hana",
    "Ian",
    "Jo",
    "Kai",
    "Lou",
    "Mo",
    "Ned",
    "Ola",
    "Pam",
    "Quin",
    "Rex",
    "Sue",
    "Ted",
    "Uma",
    "Val",
    "Wu",
    "Xia",
    "Yan",
    "Zed",
    "Abe",
    "Bo",
)
_CITIES = (
    "Oslo",
    "Rome",
    "Lima",
    "Kyiv",
    "Bern",
    "Doha",
    "Riga",
    "Baku",
    "Nice",
    "Pisa",
    "Cork",
    "Graz",
    "Turin",
    "Porto",
    "Malmo",
    "Split",
    "Paris",
    "Cairo",
    "Delhi",
    "Quito",
    "Sofia",
    "Tunis",
    "Hanoi",
    "Dakar",
    "Minsk",
    "Perth",
    "Omaha",
    "Leeds",
    "Basel",
    "Gent",
)
_STR, _INT = {"type": "string"}, {"type": "integer"}


def _schema(props: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


def _extraction_task(rng: random.Random, level: int) -> tuple[str, Callable[[], dict[str, Any]]]:
    name, age, city = rng.choice(_NAMES), rng.randint(18, 89), rng.choice(_CITIES)
    obj: dict[str, Any]  # the answer object: str, int and list values
    props: dict[str, Any]  # its JSON-schema properties
    if level == 1:
        if rng.random() < 0.5:
            prompt, obj, props = f"Extract age as JSON: {name} is {age}.", {"age": age}, {"age": _INT}
        else:
            prompt, obj, props = f"Extract name as JSON: {name} is {age}.", {"name": name}, {"name": _STR}
    elif level == 2:
        prompt, obj = f"Extract name and age as JSON: {name} is {age}.", {"name": name, "age": age}
        props = {"name": _STR, "age": _INT}
    elif level == 3:
        if rng.random() < 0.5:
            prompt, obj = f"Extract name and city as JSON: {name} lives in {city}.", {"name": name, "city": city}
            props = {"name": _STR, "city": _STR}
        else:
            prompt, obj = f"Extract name and age as JSON: Age {age}, name {name}.", {"name": name, "age": age}
            props = {"name": _STR, "age": _INT}
    elif level == 4:
        prompt = f"Extract name, age, city as JSON: {name}, {age}, from {city}."
        obj, props = {"name": name, "age": age, "city": city}, {"name": _STR, "age": _INT, "city": _STR}
    else:
        if rng.random() < 0.5:
            a, b, c = rng.sample(_NAMES, 3)
            prompt = f"Extract names as JSON: {a} met {b} and {c}."
            obj, props = {"names": [a, b, c]}, {"names": {"type": "array", "items": _STR}}
        else:
            year = rng.randint(2000, 2030)
            prompt = f"Extract name and birth year as JSON: {name} is {age} in {year}."
            obj, props = {"name": name, "born": year - age}, {"name": _STR, "born": _INT}
    text = json.dumps(obj, separators=(",", ":"))  # compact: fewer tokens for the tiny model
    return prompt, lambda: {"prompt": prompt, "reference": text, "answer": text, "metadata": {"schema": _schema(props)}}


# ----- instruction following -----------------------------------------------------------------------------------
_IF_WORDS = (
    "red",
    "sun",
    "cat",
    "dog",
    "sky",
    "tea",
    "map",
    "box",
    "owl",
    "fig",
    "ice",
    "jam",
    "key",
    "pen",
    "cup",
    "bee",
    "oak",
    "ant",
    "egg",
    "fox",
    "hat",
    "ink",
    "kit",
    "log",
)


def _instruction_task(rng: random.Random, level: int) -> tuple[str, Callable[[], dict[str, Any]]]:
    exist = "keywords:existence"
    if level <= 3:
        words = rng.sample(_IF_WORDS, 2 if level == 1 else 3)
        listed = " ".join(words)
        if level == 1:
            caps = rng.random() < 0.5
            prompt = f"Say {listed} in {'caps' if caps else 'lowercase'}."
            reference = listed.upper() if caps else listed
            case = "change_case:english_capital" if caps else "change_case:english_lowercase"
            constraints = [{"id": exist, "keywords": words}, {"id": case}]
        else:
            prompt = f"Say {listed}, lowercase, no commas" + (", under 5 words." if level == 3 else ".")
            reference = listed
            constraints = [
                {"id": exist, "keywords": words},
                {"id": "change_case:english_lowercase"},
                {"id": "punctuation:no_comma"},
            ]
            if level == 3:
                constraints.append({"id": "length_constraints:number_words", "relation": "less than", "num_words": 5})
    elif level == 4:
        k1, k2, v1, v2 = rng.sample(_IF_WORDS, 4)
        prompt = f"JSON with keys {k1} {k2}, values {v1} {v2}."
        reference = json.dumps({k1: v1, k2: v2}, separators=(",", ":"))
        constraints = [{"id": "detectable_format:json_format", "keys": [k1, k2]}, {"id": exist, "keywords": [v1, v2]}]
    else:
        w1, w2, end = rng.sample(_IF_WORDS, 3)
        prompt = f"Say {w1} {w2} in caps, no commas, end with {end}."
        reference = f"{w1} {w2} {end}".upper()
        constraints = [
            {"id": exist, "keywords": [w1, w2]},
            {"id": "change_case:english_capital"},
            {"id": "punctuation:no_comma"},
            {"id": "startend:end_checker", "end_phrase": end.upper()},
            {"id": "length_constraints:number_words", "relation": "less than", "num_words": 6},
        ]
    return prompt, lambda: {
        "prompt": prompt,
        "reference": reference,
        "answer": None,
        "metadata": {"constraints": constraints},
    }


# A maker draws one task: (prompt, finish) where finish() builds the rest of the record.
_MAKERS: dict[str, Callable[[random.Random, int], tuple[str, Callable[[], dict[str, Any]]]]] = {
    "math": _math_task,
    "code": _code_task,
    "extraction": _extraction_task,
    "instruction": _instruction_task,
}


def generate(domain: str, n: int, seed: int, difficulties: tuple[int, ...] = (1, 2, 3, 4, 5)) -> list[Task]:
    """n tasks of `domain` ("math", "code", "extraction", "instruction"), deterministic by seed; ids
    `<domain>-<seed>-<i>`."""
    if domain not in _MAKERS:
        raise ValueError(f"unknown generator domain {domain!r}; known: {', '.join(_MAKERS)}")
    levels = tuple(int(d) for d in difficulties)
    if not levels or any(not MIN_DIFFICULTY <= d <= MAX_DIFFICULTY for d in levels):
        raise ValueError(
            f"difficulties must be a non-empty subset of {MIN_DIFFICULTY}..{MAX_DIFFICULTY}, got {difficulties!r}"
        )
    make, verifier = _MAKERS[domain], DOMAIN_VERIFIER[domain]
    rng = random.Random(f"{domain}:{seed}")
    source = f"synthetic:{domain}@seed={seed}"
    seen: set[str] = set()
    tasks = []
    for i in range(n):
        level = levels[i % len(levels)]
        for _ in range(_RETRIES):
            prompt, finish = make(rng, level)
            if prompt not in seen:
                break
        seen.add(prompt)
        item = finish()
        tasks.append(
            Task(
                id=f"{domain}-{seed}-{i}",
                domain=domain,
                prompt=item["prompt"],
                verifier=verifier,
                reference=item["reference"],
                answer=item.get("answer"),
                tests=item.get("tests", []),
                difficulty=level,
                source=source,
                metadata=item.get("metadata", {}),
            )
        )
    return tasks
