"""Evaluation, apart from the stage that runs it (training/stages/evaluate.py):

config.py      EvalConfig, the evaluate stage's config
measure.py     what is measured for one model (pass@1, pass@k, format, self-repair, long context, ...)
holdout.py     the RL round's greedy holdout check before and after a round
metrics.py     pass@k estimators
candidates.py  which models are compared (candidate, SFT baseline, champion) and the RL rounds' history
plots.py       the report's plots;  report.py: report.md and report.html
gate_rules.py  GateConfig and the gate's pure rules over counts (regression, reward hacking, floors)
gate_stats.py  the statistics the rules use (Wilson and Newcombe intervals, non-inferiority test, Holm)
"""
