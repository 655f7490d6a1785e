"""Evaluation, apart from the stage that runs it (training/stages/evaluate.py):

    measure.py     what is measured for one model (pass@1, pass@k, format, self-repair, long context, ...)
    metrics.py     pass@k estimators
    candidates.py  which models are compared (candidate, SFT baseline, champion) and the RL rounds' history
    plots.py       the report's plots;  report.py: report.md and report.html
    gate_rules.py  the gate's pure rules over counts (intervals, regression, reward hacking)
"""
