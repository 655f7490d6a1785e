"""Verifiable task sets: the `Task` record and everything the `taskset` stage (training/stages/build_taskset.py)
is made of.

    schema.py      Task, DOMAINS, COLUMNS (the shared contract)
    generators.py  tiny-profile synthetic tasks: generate(domain, n, seed, difficulties)
    loaders.py     real data through `datasets`: GSM8K / MBPP / HumanEval / mapped user JSONL adapters
    validate.py    row validation with file:row: field errors; quarantine
    dedup.py       exact and near-duplicate removal, holdout n-gram contamination filter
    split.py       stratified train/holdout split, domain mixing
    io.py          save_tasks / load_tasks (parquet via `datasets`), load_stage_tasks (from a manifest)
    distractors.py other tasks as filler text (SFT's and evaluation's long-context prompts)
    sources.py     SourceSpec: one real-data source of a task set
    check.py       `posttrain taskset check FILE`
"""
