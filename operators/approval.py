"""Human approval before promotion (optional, trigger-form field `require_approval`).

`PromotionApproval` sits between the gate and the gate's branch. When the gate says promote and the run asked
for approval, it parks the task under Airflow's *Required Actions* (an Airflow 3 human-in-the-loop
`ApprovalOperator`) showing the verdict and the evaluation table; "Approve" lets the branch go on to `promote`,
"Reject" sends it to `blocked`. No answer within the timeout counts as "Reject" (the operator's default
option, which the scheduler applies when the response deadline passes). In every other case (the gate
blocked, or no approval asked for) it returns at once without asking anyone.

It returns a small dict, the branch and the promote stage read it from XCom:
``{"asked": bool, "approved": bool | None, "by": str | None, "at": iso time | None}``; `by` is "(timeout)"
when nobody answered.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from airflow.providers.standard.operators.hitl import ApprovalOperator, HITLOperator

TIMEOUT_BY = "(timeout)"


def _truthy(value: Any) -> bool:
    return str(value).strip().lower() in ("true", "1", "yes", "on")


def approval_body(gate: dict[str, Any], evaluation: dict[str, Any]) -> str:
    """The Markdown a reviewer sees: the gate's decision and reasons, then pass@1 per domain and model."""
    lines = [f"**Gate verdict: {gate.get('decision', '?')}**", ""]
    lines += [f"- {reason}" for reason in gate.get("reasons", [])] or ["- (no reasons given)"]
    stage = evaluation.get("candidate_stage")
    if stage:
        lines += ["", f"Candidate: `{stage}` at `{evaluation.get('candidate_uri', '')}`"]
    pass1: dict[str, dict[str, float]] = evaluation.get("pass1") or {}
    models = [m for m in ("candidate", "champion", "sft") if m in pass1]
    domains = sorted({d for m in models for d in pass1[m]})
    if models and domains:
        lines += [
            "",
            "Holdout pass@1 by domain:",
            "",
            "| domain | " + " | ".join(models) + " |",
            "|---" * (len(models) + 1) + "|",
        ]
        for domain in domains:
            cells = [f"{pass1[m][domain]:.1%}" if domain in pass1[m] else "n/a" for m in models]
            lines.append(f"| {domain} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


class PromotionApproval(ApprovalOperator):
    """Ask a person to approve the gate's "promote" (when `require` renders true); see the module docstring.

    :param gate_task_id: the gate stage task (its XCom summary holds decision and reasons).
    :param evaluate_task_id: the evaluate stage task (its XCom summary holds the pass@1 table).
    :param require: templated; true asks a person, anything else lets the gate's verdict stand unasked.
    :param timeout_hours: templated; how long to wait before counting it as a reject.
    """

    template_fields: Sequence[str] = (*ApprovalOperator.template_fields, "require", "timeout_hours")
    ui_color = "#fff4d6"

    def __init__(
        self,
        *,
        gate_task_id: str,
        evaluate_task_id: str,
        require: str | bool = False,
        timeout_hours: str | float = 24,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("subject", "Promote this candidate?")
        super().__init__(defaults=self.REJECT, **kwargs)
        self.gate_task_id = gate_task_id
        self.evaluate_task_id = evaluate_task_id
        self.require = require
        self.timeout_hours = timeout_hours

    def execute(self, context: Any) -> Any:
        ti = context["ti"]
        gate = (ti.xcom_pull(task_ids=self.gate_task_id) or {}).get("summary", {})
        if gate.get("decision") != "promote":
            self.log.info("the gate did not say promote (%s): nothing to approve", gate.get("decision"))
            return {"asked": False, "approved": None, "by": None, "at": None}
        if not _truthy(self.require):
            self.log.info("no approval asked for: the gate's verdict stands")
            return {"asked": False, "approved": None, "by": None, "at": None}
        evaluation = (ti.xcom_pull(task_ids=self.evaluate_task_id) or {}).get("summary", {})
        self.body = approval_body(gate, evaluation)
        self.response_timeout = timedelta(hours=float(self.timeout_hours))
        self.log.info("waiting up to %s for a person to approve or reject (Required Actions)", self.response_timeout)
        return super().execute(context)

    def execute_complete(self, context: Any, event: dict[str, Any]) -> dict[str, Any]:
        # HITLOperator's, not ApprovalOperator's: on "Reject" the latter skips the next task, but here the
        # branch after it must run to send the run to `blocked`.
        answer = HITLOperator.execute_complete(self, context=context, event=event)
        approved = answer["chosen_options"] == [self.APPROVE]
        user = answer.get("responded_by_user")
        by = (user.get("name") or user.get("id")) if user else TIMEOUT_BY
        at = answer["responded_at"].isoformat() if answer.get("responded_at") else None
        self.log.info("%s by %s at %s", "approved" if approved else "rejected", by, at)
        return {"asked": True, "approved": approved, "by": by, "at": at}


def approval_tags(approval: dict[str, Any] | None) -> dict[str, str]:
    """Tags for the registered model version recording who approved it and when (none when nobody was asked)."""
    if not approval or not approval.get("asked"):
        return {}
    return {"posttrain.approved_by": str(approval.get("by")), "posttrain.approved_at": str(approval.get("at"))}
