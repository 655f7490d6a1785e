"""Verifiable task sets: the `Task` record and the stage that builds a task set.

    schema.py      Task, DOMAINS, COLUMNS (the shared contract)
    generators.py  tiny-profile synthetic tasks: generate(domain, n, seed, difficulties)
    loaders.py     real data through `datasets`: GSM8K / MBPP / HumanEval / mapped user JSONL adapters
    validate.py    row validation with file:row: field errors; quarantine
    dedup.py       exact and near-duplicate removal, holdout n-gram contamination filter
    split.py       stratified train/holdout split, domain mixing
    io.py          save_tasks / load_tasks (parquet via `datasets`), load_stage_tasks (from a manifest)
    config.py      TasksetConfig, SourceSpec
    stage.py       `posttrain build-taskset`;  check.py: `posttrain taskset check`
"""
