"""Dedup (exact and near), the holdout n-gram contamination check, stratified splits and domain mixing."""

from __future__ import annotations

from collections import Counter

from training.tasksets.dedup import dedup, ngrams, normalize_text, overlap_filter
from training.tasksets.generators import generate
from training.tasksets.schema import Task
from training.tasksets.split import mix_train, stratified_split


def T(i, prompt, domain="math", difficulty=1, answer="1") -> Task:
    return Task(f"t{i}", domain, prompt, "math", answer=answer, difficulty=difficulty)


def test_normalisation_keeps_what_changes_the_task() -> None:
    same = ["What is 2 + 3?", "what is 2+3", "WHAT  IS 2+3 ?!", "What is 2 \u2212 3?".replace("\u2212", "+")]
    assert len({normalize_text(p) for p in same}) == 1
    different = [
        "Q: 2+3=? A:",
        "Q: 3+2=? A:",
        "Q: 2*3=? A:",
        "Q: 2-3=? A:",
        "Q: 23=? A:",
        "Q: 2.5+1=? A:",
        "Q: 25+1=? A:",
        "Q: 12 3=? A:",
        "Q: 1 23=? A:",
    ]
    assert len({normalize_text(p) for p in different}) == len(different)
    assert normalize_text("x \u2212 1") == normalize_text("x - 1")


def test_dedup_exact_near_and_conflicts() -> None:
    tasks = [
        T(0, "What is 2 + 3?", answer="5"),
        T(1, "What is 2 + 3?", answer="5"),
        T(2, "what is 2+3", answer="6"),
        T(3, "What is 3 + 2?", answer="5"),
        T(4, "Q: 2*3=? A:", answer="6"),
    ]
    kept, report = dedup(tasks)
    assert [t.id for t in kept] == ["t0", "t3", "t4"]
    assert report["exact_duplicates"] == 1 and report["near_duplicates"] == 1
    assert report["conflicting_answers"] == 1
    assert report["near_examples"] == [
        {"kept": "t0", "dropped": "t2", "kept_prompt": "What is 2 + 3?", "dropped_prompt": "what is 2+3"}
    ]


def test_overlap_filter_drops_contaminated_train() -> None:
    long_holdout = (
        "Natalia sold clips to 48 of her friends in April and then she sold half as many clips in "
        "May how many clips did she sell"
    )
    holdout = [T(100, long_holdout), T(101, "Q: 7+8=? A:")]
    train = [
        T(0, "Background. " + long_holdout[:90] + " ... rest differs entirely here"),  # shares a 13-gram
        T(1, "Natalia sold pencils to 12 friends in June; how many?"),  # shares only short grams
        T(2, "Q: 7+8=? A:"),  # same short prompt
        T(3, "Q: 7+9=? A:"),
        T(4, "q 7 + 8 = a"),  # same after normalising
    ]
    kept, report = overlap_filter(train, holdout, n=13)
    assert [t.id for t in kept] == ["t1", "t3"]
    assert report["contaminated"] == report["dropped"] == 3
    assert {(e["train_id"], e["holdout_id"]) for e in report["examples"]} == {
        ("t0", "t100"),
        ("t2", "t101"),
        ("t4", "t101"),
    }
    kept, report = overlap_filter(train, holdout, n=13, drop=False)
    assert len(kept) == 5 and report["contaminated"] == 3 and report["dropped"] == 0
    assert len(ngrams(long_holdout, 13)) == len(long_holdout.split()) - 12


def test_stratified_split_proportions_and_determinism() -> None:
    tasks = generate("math", 1000, 0, difficulties=(2, 3, 4, 5)) + generate("extraction", 500, 0)
    train, holdout = stratified_split(tasks, 0.2, seed=3)
    assert len(train) + len(holdout) == len(tasks) and not {t.id for t in train} & {t.id for t in holdout}
    groups = Counter((t.domain, t.difficulty) for t in tasks)
    held = Counter((t.domain, t.difficulty) for t in holdout)
    assert held == {g: round(0.2 * n) for g, n in groups.items()}
    assert stratified_split(tasks, 0.2, seed=3) == (train, holdout)
    assert stratified_split(tasks, 0.2, seed=4)[1] != holdout
    tiny = [T(0, "a"), T(1, "b", difficulty=2), T(2, "c", difficulty=2)]
    tr, ho = stratified_split(tiny, 0.1, 0)  # a group of 2 still gives one holdout task, a group of 1 none
    assert Counter(t.difficulty for t in ho) == {2: 1} and len(tr) == 2


def test_mix_train_ratios() -> None:
    train = (
        [T(i, f"m{i}", "math", 1 + i % 5) for i in range(600)]
        + [T(1000 + i, f"c{i}", "code", 1 + i % 5) for i in range(100)]
        + [T(2000 + i, f"u{i}", "user", 1) for i in range(7)]
    )
    mixed, report = mix_train(train, {"math": 0.5, "code": 0.5}, seed=0)
    counts = Counter(t.domain for t in mixed)
    assert counts == {"math": 100, "code": 100, "user": 7}  # unmixed domains kept whole
    assert Counter(t.difficulty for t in mixed if t.domain == "math") == dict.fromkeys(range(1, 6), 20)
    assert report["subsampled"] and report["dropped"] == 500 and report["unmixed_domains"] == ["user"]
    # within tolerance: nothing dropped
    mixed, report = mix_train(train[:600] + train[600:700], {"math": 0.84, "code": 0.16}, seed=0, tolerance=0.05)
    assert len(mixed) == 700 and not report["subsampled"]
    # ratio 0 drops a domain; empty ratios keep everything
    mixed, _ = mix_train(train, {"math": 1.0, "code": 0.0}, seed=0)
    assert Counter(t.domain for t in mixed) == {"math": 600, "user": 7}
    assert mix_train(train, {}, seed=0)[0] == train
