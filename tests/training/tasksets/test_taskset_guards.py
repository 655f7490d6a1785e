"""Task sets that cannot silently empty: a filter that takes (nearly) a whole domain, or an empty split, fails
the build naming the filter and the counts; decontamination ignores n-grams common across the corpus."""

from __future__ import annotations

import json
import random

import pytest

from training.stages.build_taskset import TasksetConfig, TasksetEmptied, build
from training.tasksets.dedup import common_ngrams, overlap_filter
from training.tasksets.schema import Task
from training.tasksets.sources import SourceSpec

TEMPLATE = (
    "Solve the following grade school math problem carefully and show every step of your reasoning "
    "before the final answer. Question: {name} has {a} apples and buys {b} more at the market on {day}. "
    "How many apples does {name} have now?"
)


def _gsm8k_rows(n: int) -> list[dict]:
    rng = random.Random(0)
    names, days = ["Tom", "Ana", "Li", "Sam", "Noor", "Kofi"], ["Monday", "Friday", "Sunday"]
    rows, seen = [], set()
    while len(rows) < n:
        name, a, b, day = rng.choice(names), rng.randint(2, 99), rng.randint(2, 99), rng.choice(days)
        if (name, a, b, day) in seen:
            continue
        seen.add((name, a, b, day))
        rows.append(
            {
                "question": TEMPLATE.format(name=name, a=a, b=b, day=day),
                "answer": f"{a} + {b} = <<{a}+{b}={a + b}>>{a + b}\n#### {a + b}",
            }
        )
    return rows


def _config(tmp_path, rows: list[dict], **kw) -> TasksetConfig:
    path = tmp_path / "gsm.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return TasksetConfig(profile="data", sources=[SourceSpec(str(path), adapter="gsm8k")], mix={}, **kw)


def test_templated_rows_keep_their_train_split(tmp_path) -> None:
    """400 GSM8K-shaped rows sharing one template: once every row shared a 13-gram of template text with the
    holdout and train came out empty; now the template's n-grams are recognised as common and ignored."""
    result = build(_config(tmp_path, _gsm8k_rows(400)))
    report = result.report
    assert len(result.train) >= 340 and len(result.holdout) >= 35, report["overlap"]
    assert report["overlap"]["common_ngrams_ignored"] > 0
    assert report["overlap"]["dropped"] <= 0.1 * 400
    print(
        f"templated GSM8K: train {len(result.train)}, holdout {len(result.holdout)}, dropped as contaminated "
        f"{report['overlap']['dropped']}, common n-grams ignored {report['overlap']['common_ngrams_ignored']}"
    )


def test_without_common_ngrams_the_loss_is_named_not_silent(tmp_path) -> None:
    message = (
        r"decontamination \(13-gram overlap with the holdout\) dropped \d+ of \d+ 'math' rows "
        r"\(100%, more than max_filter_loss=0.75\); 0 left"
    )
    with pytest.raises(TasksetEmptied, match=message):
        build(_config(tmp_path, _gsm8k_rows(400), ngram_common=0.0))


def test_a_real_overlap_is_still_dropped() -> None:
    filler = [
        Task(f"f{i}", "math", TEMPLATE.format(name="Tom", a=i, b=i + 1, day="Monday"), "math", answer="1")
        for i in range(30)
    ]
    leak = "A train leaves Paris at noon travelling at eighty kilometres per hour towards a city three hundred km away"
    holdout = [Task("h", "math", leak + ". When does it arrive?", "math", answer="3")]
    train = [Task("t", "math", "Copied: " + leak + "?", "math", answer="3"), *filler]
    kept, report = overlap_filter(train, holdout, 13, common_min_prompts=10)
    assert [t.id for t in kept] == [f"f{i}" for i in range(30)] and report["dropped"] == 1
    assert report["examples"][0]["holdout_id"] == "h"
    assert "show every step of your reasoning before the final answer question" in " ".join(
        common_ngrams([t.prompt for t in filler], 13, 10)
    )


def test_dedup_taking_a_domain_and_an_empty_holdout_fail_the_build(tmp_path) -> None:
    same = [{"question": "What is 2+3?", "answer": "#### 5"}] * 10
    with pytest.raises(TasksetEmptied, match=r"dedup \(same normalised prompt\) dropped 9 of 10 'math' rows"):
        build(_config(tmp_path, same))
    with pytest.raises(TasksetEmptied, match="the holdout split is empty"):
        build(_config(tmp_path, _gsm8k_rows(1), split="shuffle"))  # a group of one is never held out
    with pytest.raises(TasksetEmptied, match="the train split is empty"):
        build(_config(tmp_path, _gsm8k_rows(1)))  # the hash put the only task in the holdout
    # an explicit max_filter_loss=1 accepts what the data is
    assert len(build(_config(tmp_path, same, max_filter_loss=1.0, holdout_fraction=0.0)).train) == 1
