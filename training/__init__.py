"""Everything that runs inside a pipeline stage; never imports Airflow.

    stages/       one module per stage (Config, body, cli), named as `posttrain <stage>` names it
    stage.py      the stage contract (skip when complete, MLflow run, manifest last, POSTTRAIN_RESULT line)
    cli.py        `posttrain`: every stage and tool
    tasksets/     Task records: generators, real-data loaders, validation, dedup, split, parquet I/O
    rewards/      the Verifier interface; math (math-verify), code (sandbox/), json_rules, judge, format;
                  weighted rewards and `score_tasks`
    rollout/      rollout engines (transformers, vLLM) behind one protocol
    evaluation/   measurements, report rendering, plots and the gate's rules
    algorithms.py advantage estimators, policy losses, KL estimators (pure tensor maths, registered by name)
    grpo_batches.py, kv_cache.py, curriculum.py   the GRPO update's tensors, shared KV-cache helpers, prompt choice
    models.py, checkpointing.py, devices.py, optimizers.py   models and tokenizers, resumable checkpoints
    storage.py, tracking.py, registry.py, config.py, profiles.py   S3/file storage, MLflow, configs, presets

docs/architecture.md has the whole picture.
"""
