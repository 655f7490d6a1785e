"""One module per pipeline stage, named as the CLI names it. Each has the same shape: its Config dataclass,
its body (`body(ctx) -> summary`, run under the stage contract of training/stage.py), and `cli(argv, prog)`.

    posttrain build-taskset  -> build_taskset.py  (stage folder `taskset`)
    posttrain sft            -> sft.py            (`sft`)
    posttrain rl-round       -> rl_round.py       (`rl_round_<N>`; the round itself: training/rl/)
    posttrain evaluate       -> evaluate.py       (`evaluate`)
    posttrain gate           -> gate.py           (`gate`)
    posttrain promote        -> promote.py        (`promote`)

docs/architecture.md describes the contract and how to add a stage.
"""
