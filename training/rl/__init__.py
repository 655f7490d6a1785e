"""The RL round: everything `posttrain rl-round` runs, apart from the stage body (training/stages/rl_round.py).

config.py        GRPOConfig, the round's one config dataclass
round.py         Round: rollouts -> one Draw record per draw -> informative groups -> credit -> update -> metrics
credit.py        which groups carry signal (dynamic sampling) and each completion's advantage (turn credit)
update.py        the policy update: policy and reference log-probs, truncated importance sampling, the loss
algorithms.py    advantage estimators, policy losses, KL estimators (pure tensor maths, registered by name)
grpo_batches.py  the update's tensor layouts: padded rows or packed groups, micro-batches
curriculum.py    prompt choice: the domain mix and the curriculum over difficulties
memory.py        the start-up check that the round fits a rank
"""
