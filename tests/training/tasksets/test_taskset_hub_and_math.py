"""MATH-style records, and hub ids loaded from a local `datasets` cache with HF_DATASETS_OFFLINE=1 (the cache is
built here from a local file, laid out as a hub download leaves it; no network)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from training.tasksets.loaders import load_source, source_label
from training.tasksets.sources import SourceSpec
from training.tasksets.validate import validate_rows

ROOT = Path(__file__).resolve().parents[3]
MATH = [
    {
        "problem": "What is $\\sin 60^\\circ$?",
        "level": "Level 2",
        "type": "Precalculus",
        "solution": "From the unit circle, $\\sin 60^\\circ = \\boxed{\\frac{\\sqrt{3}}{2}}$.",
    },
    {
        "problem": "Solve $x^2 = 4$ for $x > 0$.",
        "level": "Level 1",
        "type": "Algebra",
        "solution": "Either $x = -2$ (\\boxed{-2} is excluded) or $x = \\boxed{2}$.",
    },
    {"problem": "No answer here.", "level": "Level 9", "solution": "We give up."},
]


def test_math_records_take_the_last_boxed_answer(tmp_path) -> None:
    from training.rewards import score_tasks, verify_tasks

    path = tmp_path / "math.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in MATH))
    spec = SourceSpec(str(path), adapter="math")
    result = validate_rows(load_source(spec), source_label(spec))
    assert [(e.row, e.field) for e in result.errors] == [(3, "solution")]
    first, second = result.tasks
    assert (first.answer, first.difficulty, first.metadata) == (
        "\\frac{\\sqrt{3}}{2}",
        2,
        {"answer_format": "boxed", "subject": "Precalculus"},
    )
    assert (second.answer, second.domain, second.verifier) == ("2", "math", "math")
    # the references pass strictly; a symbolic equivalent passes; the same value outside \boxed{} only leniently
    assert score_tasks(result.tasks, [t.reference for t in result.tasks]) == [1.0, 1.0]
    comps = ["so it is $\\boxed{\\sqrt3/2}$", "x equals 2"]
    assert verify_tasks(result.tasks, comps) == [True, True]
    assert verify_tasks(result.tasks, comps, strict=True) == [True, False]


BUILD_CACHE = """
import json, shutil, sys
from pathlib import Path
from datasets.packaged_modules.json.json import Json

cache, rows = Path(sys.argv[1]), json.loads(sys.argv[2])
src = cache.parent / "train.jsonl"
src.write_text("".join(json.dumps(r) + "\\n" for r in rows))
builder = Json(cache_dir=str(cache / "build"), config_name="main", dataset_name="gsm8k",
               data_files={"train": str(src)})
builder.download_and_prepare()
# where a download of the hub dataset openai/gsm8k, config "main", leaves its Arrow files
target = cache / "openai___gsm8k" / "main" / "0.0.0" / "0123456789abcdef"
target.parent.mkdir(parents=True)
shutil.move(builder.cache_dir, str(target))
shutil.rmtree(cache / "build")
"""
LOAD = """
import json
from training.tasksets.loaders import load_source
from training.tasksets.sources import SourceSpec
rows = list(load_source(SourceSpec("openai/gsm8k", adapter="gsm8k", name="main", split="train")))
print(json.dumps([[r.row, r.data, [str(e) for e in r.errors]] for r in rows]))
"""


def test_hub_id_loads_from_the_local_cache_offline(tmp_path) -> None:
    rows = [
        {"question": "What is 2+3?", "answer": "2+3 = <<2+3=5>>5\n#### 5"},
        {"question": "A farm has 1,200 hens and sells 200. How many are left?", "answer": "1200-200\n#### 1,000"},
    ]
    env = {
        **os.environ,
        "HF_HOME": str(tmp_path / "hf"),
        "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": str(ROOT),
    }
    env.pop("HF_DATASETS_CACHE", None)
    cache = tmp_path / "hf" / "datasets"
    cache.mkdir(parents=True)
    subprocess.run(
        [sys.executable, "-c", BUILD_CACHE, str(cache), json.dumps(rows)], env=env, check=True, capture_output=True
    )
    out = subprocess.run([sys.executable, "-c", LOAD], env=env, check=True, capture_output=True, text=True)
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert [(row, data["prompt"], data["answer"], errors) for row, data, errors in loaded] == [
        (1, "What is 2+3?", "5", []),
        (2, rows[1]["question"], "1000", []),
    ]
    # and a hub id that is not in the cache fails with the load error, not a hang or a download
    env["PYTHONPATH"] = str(ROOT)
    missing = subprocess.run(
        [sys.executable, "-c", LOAD.replace("openai/gsm8k", "nobody/nothing")],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    ((row, data, errors),) = json.loads(missing.stdout.strip().splitlines()[-1])
    assert row == 0 and data is None and "cannot load" in errors[0]
