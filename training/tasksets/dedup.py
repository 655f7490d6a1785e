"""Duplicate and contamination control.

`normalize_text` is the key for near-duplicates: NFKC, casefold, unicode minus -> "-", sentence punctuation
(. , ; : ! ? quotes) dropped except `.`/`,` between digits, whitespace collapsed and dropped next to symbols.
Digits and operators are kept: "2+3", "3+2", "2*3" and "2.5+1" are four different tasks, while
"What is 2 + 3?" and "what is 2+3" are one.

- `dedup(tasks)`: keep the first task of each normalised prompt; counts exact (identical prompt text) and near
  (same key, different text) duplicates and how many of them disagreed on the answer (`answer` field; code tasks
  with the same prompt but other test inputs are not conflicts).
- `overlap_filter(train, holdout, n)`: drop every train task that shares a word n-gram with a holdout task
  (tokens: words, numbers and single symbols of the normalised prompt). A prompt shorter than n tokens counts
  as one gram of its full length, so two short prompts overlap only if they are equal after normalisation;
  long templated prompts ("Write f(x) returning x plus 3.") stay under the default n=13 (the GPT-3 paper's
  decontamination n, Brown et al. 2020, App. C) and are not flagged for sharing their template. N-grams common
  across the corpus (in at least `common_min_prompts` prompts: shared instructions, question templates) are
  cut out before comparing, so only rows whose own content overlaps a holdout item are dropped.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Sequence
from typing import Any

from training.tasksets.schema import Task

_MINUS = str.maketrans({"\u2212": "-", "\ufe63": "-", "\uff0d": "-", "\u2013": "-", "\u2012": "-"})
_SOFT_PUNCT_RE = re.compile(r"(?<!\d)[.,]|[.,](?!\d)|[;:!?\"'`\u2018\u2019\u201c\u201d]")
_SPACE_RE = re.compile(r"\s+")
_SYMBOL_SPACE_RE = re.compile(r" ?([^\w ]) ?")
_TOKEN_RE = re.compile(r"\w+|[^\w\s]")


def normalize_text(text: str) -> str:
    t = unicodedata.normalize("NFKC", text).casefold().translate(_MINUS)
    t = _SOFT_PUNCT_RE.sub(" ", t)
    t = _SPACE_RE.sub(" ", t).strip()
    return _SYMBOL_SPACE_RE.sub(r"\1", t)


def tokens(text: str) -> list[str]:
    return _TOKEN_RE.findall(normalize_text(text))


def _grams(toks: list[str], n: int) -> set[str]:
    if len(toks) <= n:
        return {" ".join(toks)} if toks else set()
    return {" ".join(toks[i : i + n]) for i in range(len(toks) - n + 1)}


def ngrams(text: str, n: int, common: set[str] | frozenset[str] = frozenset()) -> set[str]:
    """Word n-grams of a prompt. With `common`: of what is left once every span covered by a common n-gram is
    cut out (the row's own content, without the template around it)."""
    toks = tokens(text)
    if not common or len(toks) <= n:
        grams = _grams(toks, n)
        return grams - common if common else grams
    covered = [False] * len(toks)
    for i in range(len(toks) - n + 1):
        if " ".join(toks[i : i + n]) in common:
            covered[i : i + n] = [True] * n
    return _grams([t for t, c in zip(toks, covered) if not c], n)


def dedup(tasks: Sequence[Task], max_examples: int = 10) -> tuple[list[Task], dict[str, Any]]:
    """First task of each normalised prompt, in input order, plus a report."""
    first: dict[str, Task] = {}
    kept: list[Task] = []
    exact = near = conflicts = 0
    examples: list[dict[str, str]] = []
    for task in tasks:
        key = normalize_text(task.prompt)
        seen = first.get(key)
        if seen is None:
            first[key] = task
            kept.append(task)
            continue
        if seen.prompt == task.prompt:
            exact += 1
        else:
            near += 1
            if len(examples) < max_examples:
                examples.append(
                    {
                        "kept": seen.id,
                        "dropped": task.id,
                        "kept_prompt": seen.prompt[:200],
                        "dropped_prompt": task.prompt[:200],
                    }
                )
        if seen.answer != task.answer:
            conflicts += 1
    return kept, {
        "input": len(tasks),
        "kept": len(kept),
        "exact_duplicates": exact,
        "near_duplicates": near,
        "conflicting_answers": conflicts,
        "near_examples": examples,
    }


def common_ngrams(prompts: Sequence[str], n: int, min_prompts: int) -> set[str]:
    """The word n-grams found in at least `min_prompts` different prompts (shared instructions, templates)."""
    if min_prompts <= 0:
        return set()
    counts: Counter[str] = Counter()
    for prompt in prompts:
        counts.update(ngrams(prompt, n))
    return {gram for gram, k in counts.items() if k >= min_prompts}


def overlap_filter(
    train: Sequence[Task],
    holdout: Sequence[Task],
    n: int = 13,
    drop: bool = True,
    max_examples: int = 10,
    common_min_prompts: int = 0,
) -> tuple[list[Task], dict[str, Any]]:
    """Train tasks without any word n-gram of a holdout prompt (all of them when drop=False), plus a report.

    N-grams found in at least `common_min_prompts` prompts of train and holdout together are common: text every
    task shares (an instruction, a question template) says nothing about one holdout item leaking. The spans
    they cover are cut out of every prompt before its n-grams are compared, so two rows overlap only where
    their own content does (a question pasted into another, not a template with other numbers)."""
    common = common_ngrams([t.prompt for t in (*train, *holdout)], n, common_min_prompts)
    index: dict[str, str] = {}
    for task in holdout:
        for gram in ngrams(task.prompt, n, common):
            index.setdefault(gram, task.id)
    kept: list[Task] = []
    hits = 0
    examples: list[dict[str, str]] = []
    for task in train:
        hit = next((g for g in ngrams(task.prompt, n, common) if g in index), None)
        if hit is None:
            kept.append(task)
            continue
        hits += 1
        if len(examples) < max_examples:
            examples.append({"train_id": task.id, "holdout_id": index[hit], "ngram": hit[:200]})
        if not drop:
            kept.append(task)
    return kept, {
        "ngram": n,
        "train_checked": len(train),
        "holdout_grams": len(index),
        "contaminated": hits,
        "dropped": hits if drop else 0,
        "common_ngrams_ignored": len(common),
        "common_min_prompts": common_min_prompts,
        "examples": examples,
    }
