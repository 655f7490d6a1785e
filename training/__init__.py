"""Everything that runs inside a pipeline stage; never imports Airflow.

The stage contract, at the top of the package (what every stage and the CLI share):
    stage.py          run_stage: skip when complete, MLflow run, lease, manifest last, the POSTTRAIN_RESULT line
    storage.py        S3/file storage with manifests (storage_backends.py: the file and S3 backends, retries)
    lease.py, checkpointing.py, tracking.py, registry.py, config.py, phases.py, profiles.py (model_size.py:
                      a model's parameter count from its config.json, for the presets)
    entry_points.py   verifiers and environments that other packages register (`posttrain.verifiers`, ...)
    cli.py            `posttrain`: every stage and tool (cli_storage.py, score_cli.py: the storage and score tools)

The wings, lowest first (a lower wing never imports a higher one; tests/test_layout.py checks it):
    rewards/          the Verifier interface; math (math-verify), code (sandbox/), rules, judge, format
    tasksets/         Task records: generators, real-data loaders, validation, dedup, split, parquet I/O
    modeling/         models, chat rendering, LoRA, precision, devices, optimizers, KV cache, DDP/FSDP
    rollout/          rollout engines (transformers, vLLM) behind one protocol, and the engine choice
    environments/     multi-turn episodes: code repair, calculator, planted first answers
    evaluation/       measurements, the RL round's holdout check, reports, plots, the gate's rules and configs
    rl/               the RL round: GRPOConfig, Round, credit assignment, the update, algorithms, batch layouts
    stages/           one module per stage (Config, body, cli), named as `posttrain <stage>` names it

docs/architecture.md has the whole picture.
"""
