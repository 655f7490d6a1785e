"""The gate and promote stages on planted evaluation reports (the model-free half of issue 6)."""

from __future__ import annotations

import json

from training import cli, registry, storage


def _model(**rates: float) -> dict:
    return {"uri": "", "domains": {d: {"pass1": {"passed": round(r * 100), "total": 100}} for d, r in rates.items()}}


def _plant(run_uri: str, report: dict, candidate_stage: str = "rl_round_2") -> str:
    cand = storage.ManifestWriter(storage.join(run_uri, candidate_stage))
    cand.put_bytes(b"weights", "model/model.safetensors")
    cand.commit()
    report["models"]["candidate"]["uri"] = cand.uri
    report["candidate_stage"] = candidate_stage
    ev = storage.ManifestWriter(storage.join(run_uri, "evaluate"))
    ev.put_json(report, "report.json")
    ev.commit()
    return cand.uri


def _verdict(run_uri: str) -> dict:
    return storage.read_json(storage.require_manifest(storage.join(run_uri, "gate")), "verdict.json")


def test_degraded_candidate_blocked_and_promote_refused(file_run_uri, local_mlflow, capsys) -> None:
    _plant(file_run_uri, {"models": {"candidate": _model(math=0.62, code=0.10), "sft": _model(math=0.40, code=0.35)}})
    assert cli.main(["gate", "--run", file_run_uri]) == 0
    verdict = _verdict(file_run_uri)
    assert verdict["decision"] == "block"
    assert [(f["rule"], f["domain"]) for f in verdict["findings"]] == [("regression", "code")]
    assert cli.main(["promote", "--run", file_run_uri, "--set", "model_name=m-degraded"]) == 2
    assert "the gate blocked this candidate: code: pass@1 0.100 vs sft 0.350" in capsys.readouterr().err
    assert registry.champion("m-degraded") is None
    assert storage.read_manifest(storage.join(file_run_uri, "promote")) is None


def test_reward_hack_blocked(file_run_uri, local_mlflow) -> None:
    _plant(
        file_run_uri,
        {
            "models": {"candidate": _model(math=0.20, code=0.30), "sft": _model(math=0.45, code=0.30)},
            "rounds": [
                {"stage": "rl_round_1", "train_reward_mean": 0.30},
                {"stage": "rl_round_2", "train_reward_mean": 0.70},
            ],
        },
    )
    assert cli.main(["gate", "--run", file_run_uri, "--set", 'references=["champion"]']) == 0
    verdict = _verdict(file_run_uri)
    assert verdict["decision"] == "block"
    assert [(f["rule"], f["domain"]) for f in verdict["findings"]] == [("reward_hacking", "math")]


def test_improvement_promoted_and_alias_moves(file_run_uri, local_mlflow, capsys) -> None:
    cand_uri = _plant(
        file_run_uri, {"models": {"candidate": _model(math=0.70, code=0.36), "sft": _model(math=0.40, code=0.35)}}
    )
    assert cli.main(["gate", "--run", file_run_uri]) == 0
    assert _verdict(file_run_uri)["decision"] == "promote"
    assert cli.main(["promote", "--run", file_run_uri, "--set", "model_name=m-good"]) == 0
    champ = registry.champion("m-good")
    assert champ is not None and champ.source == cand_uri and champ.version == "1"
    promotion = storage.read_json(storage.require_manifest(storage.join(file_run_uri, "promote")), "promotion.json")
    assert promotion == {"model_name": "m-good", "version": "1", "alias": "champion", "source": cand_uri}
    out = capsys.readouterr().out
    assert json.loads(out.strip().splitlines()[-1].split(" ", 1)[1])["summary"]["version"] == "1"


def _full_model(pass1: float, fmt: float, long_ctx: float) -> dict:
    """A model report with the dimensions the gate reads, 100 holdout tasks per domain."""
    return {
        "uri": "",
        "domains": {
            d: {
                "pass1": {"passed": round(pass1 * 100), "total": 100},
                "format": {"passed": round(fmt * 100), "total": 100},
                "format_rate": fmt,
                "long_context_sweep": [
                    {"fraction": f, "passed": round(long_ctx * 40), "total": 40} for f in (0.25, 0.5)
                ],
                "long_context": {"passed": round(long_ctx * 40), "total": 40, "consistency": None},
            }
            for d in ("math", "code")
        },
    }


def test_verdict_names_rule_and_numbers_for_each_planted_case(file_run_uri, local_mlflow) -> None:
    # better pass@1, collapsed format and long context: blocked on format by default
    _plant(file_run_uri, {"models": {"candidate": _full_model(0.60, 0.30, 0.10), "sft": _full_model(0.45, 0.95, 0.40)}})
    assert cli.main(["gate", "--run", file_run_uri, "--set", 'metrics=["pass1", "format", "long_context"]']) == 0
    verdict = _verdict(file_run_uri)
    assert verdict["decision"] == "block"
    assert sorted((f["rule"], f["metric"], f["domain"]) for f in verdict["findings"]) == [
        ("regression", "format", "all"),
        ("regression", "format", "code"),
        ("regression", "format", "math"),
        ("regression", "long_context", "all"),
        ("regression", "long_context", "code"),
        ("regression", "long_context", "math"),
    ]
    lc = next(f for f in verdict["findings"] if f["metric"] == "long_context" and f["domain"] == "math")
    assert lc["numbers"]["candidate"] == 0.10 and lc["numbers"]["reference"] == 0.40  # summed over the sweep
    assert all("[rule regression, " in r for r in verdict["reasons"])
    checks = {(c["rule"], c["metric"], c["domain"]): c["decision"] for c in verdict["checks"]}
    assert checks[("regression", "pass1", "math")] == "pass"
    md = storage.read_bytes(storage.require_manifest(storage.join(file_run_uri, "gate")), "verdict.md").decode()
    assert md.startswith("# Gate: BLOCK") and "| regression | sft | math | long_context | **block** |" in md


def test_metric_counts_read_every_dimension() -> None:
    from training.evaluation.gate_rules import Counts
    from training.stages.gate import metric_counts

    report = {
        "domains": {
            "code": {
                "pass1": {"passed": 30, "total": 50},
                "pass1_strict": {"passed": 28, "total": 50},
                "format_rate": 0.9,  # an older report: the rate only -> 45/50
                "long_context": {"passed": 7, "total": 20, "consistency": 0.5},
                "self_repair": {"failed_first": 20, "repaired_within": {"1": 4, "2": 6}},
            },
            "math": {
                "pass1": {"passed": 10, "total": 40},
                "format": {"passed": 38, "total": 40},
                "long_context_sweep": [
                    {"fraction": 0.1, "passed": 5, "total": 10},
                    {"fraction": 0.5, "passed": 1, "total": 10},
                ],
            },
        }
    }
    assert metric_counts(report, "pass1_strict") == {"code": Counts(28, 50)}
    assert metric_counts(report, "format") == {"code": Counts(45, 50), "math": Counts(38, 40)}
    assert metric_counts(report, "long_context") == {"code": Counts(7, 20), "math": Counts(6, 20)}
    assert metric_counts(report, "self_repair") == {"code": Counts(36, 50)}  # 30 first + 6 within 2 turns
