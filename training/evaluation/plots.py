"""The evaluation report's plots, as PNG files: pass@1 per domain for every model, pass@1 over the long-context
sweep (candidate and SFT), and reward and holdout per RL round."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from training.evaluation.measure import pass1_rate


def plot_report(report: dict[str, Any], out_dir: Path) -> dict[str, Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    models = report["models"]
    domains = sorted(models["candidate"]["domains"])
    fig, ax = plt.subplots(figsize=(7, 3.6))
    width = 0.8 / len(models)
    colours = {"sft": "#9aa0a6", "champion": "#f4b400", "candidate": "#1a73e8"}
    for j, (name, rep) in enumerate(models.items()):
        xs = [i + (j - (len(models) - 1) / 2) * width for i in range(len(domains))]
        ax.bar(xs, [pass1_rate(rep, d) * 100 for d in domains], width, label=name, color=colours.get(name))
    ax.set_xticks(range(len(domains)), domains)
    ax.set_ylabel("holdout pass@1 (%)")
    ax.set_ylim(0, 100)
    ax.set_title("pass@1 per domain: candidate vs champion vs SFT baseline")
    ax.legend(loc="upper right")
    paths["pass1_by_domain"] = _save(fig, out_dir / "pass1_by_domain.png")

    sweeps = {
        (name, d): rep["domains"][d].get("long_context_sweep", [])
        for name, rep in models.items()
        for d in domains
        if d in rep["domains"]
    }
    if any(len(points) > 1 for points in sweeps.values()):
        fig, ax = plt.subplots(figsize=(7, 3.4))
        for (name, d), points in sweeps.items():
            if name not in ("candidate", "sft") or len(points) < 2:
                continue
            xs = [p["fraction"] * 100 for p in points]
            ys = [p["passed"] / p["total"] * 100 if p["total"] else float("nan") for p in points]
            ax.plot(xs, ys, "o-" if name == "candidate" else "s--", label=f"{name} {d}")
        ax.set_xlabel("distractor length (% of the context window)")
        ax.set_ylabel("pass@1 (%)")
        ax.set_ylim(0, 100)
        ax.set_title("long context: pass@1 behind distractors of growing length")
        ax.legend(fontsize=7, loc="upper right")
        paths["long_context_sweep"] = _save(fig, out_dir / "long_context_sweep.png")

    rounds = report.get("rounds", [])
    if rounds:
        fig, ax = plt.subplots(figsize=(7, 3.2))
        xs = list(range(1, len(rounds) + 1))
        ax.plot(xs, [r.get("train_reward_mean", float("nan")) for r in rounds], "o-", label="train reward (mean)")
        for domain in domains:
            ys = []
            for r in rounds:
                h = (r.get("holdout") or {}).get(domain)
                ys.append(h["passed"] / h["total"] if h and h.get("total") else float("nan"))
            ax.plot(xs, ys, "s--", label=f"holdout pass@1 {domain}")
        ax.set_xticks(xs, [f"round {x}" for x in xs])
        ax.set_ylim(0, 1)
        ax.set_title("reward and holdout per RL round")
        ax.legend(fontsize=7, loc="lower right")
        paths["reward_per_round"] = _save(fig, out_dir / "reward_per_round.png")
    return paths


def _save(fig: Any, path: Path) -> Path:
    """Write `fig` as a PNG and free it (pyplot keeps every open figure alive)."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
