"""The manifests the Kubernetes launcher builds, validated against the real Kubernetes OpenAPI schemas.

No API server installs here, so `kubernetes-validate` (the upstream schemas, bundled per release) stands in for
the server's own validation. Strict mode: an unknown field (a typo the server would silently drop, or reject
under `kubectl apply --validate=strict`) fails too. The version is the oldest release the project supports.

A PyTorchJob is a custom resource (Kubeflow's training operator), whose schema is not in the Kubernetes
release. Its replicas' pod templates are `PodTemplateSpec`s, validated here as the pods they become; the
job's own fields are checked by test_kubernetes.py."""

from __future__ import annotations

from typing import Any

import pytest

from operators.launchers.kubernetes import pod_manifest, pytorchjob_manifest
from operators.spec import StageSpec

kubernetes_validate = pytest.importorskip("kubernetes_validate")

KUBERNETES_VERSION = "1.30.0"

SPECS = {
    "cpu stage": StageSpec("gate", launcher="kubernetes"),
    "gpu stage with limits": StageSpec(
        "rl-round", launcher="kubernetes", image="reg/posttrain-train:1", gpus=4, memory="64Gi", cpus=16
    ),
    "fractional cpus": StageSpec("evaluate", launcher="kubernetes", cpus=0.5, memory="512Mi", timeout_s=600),
    "torchrun on one node": StageSpec("sft", launcher="kubernetes", gpus=1, nproc_per_node=4),
}


def _validate(manifest: dict[str, Any]) -> None:
    kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("case", sorted(SPECS))
def test_stage_pods_validate_against_the_kubernetes_schema(case: str) -> None:
    spec = SPECS[case]
    env = {"POSTTRAIN_RUN": "s3://b/runs/r1", "MLFLOW_TRACKING_URI": "http://mlflow:5000"}
    _validate(pod_manifest(spec, spec.argv("s3://b/runs/r1", "{}"), env, "posttrain-x-1", "ml", "trainer"))
    _validate(pod_manifest(spec, spec.argv("s3://b/runs/r1", None), {}, "posttrain-x-2", "ml"))


def test_pytorchjob_pod_templates_validate_as_pods() -> None:
    spec = StageSpec("rl-round", launcher="kubernetes", gpus=8, nproc_per_node=8, nnodes=3, memory="400Gi")
    job = pytorchjob_manifest(spec, spec.argv("s3://b/runs/r1", None), {"A": "1"}, "pt-1", "ml", "trainer")
    for role, replica in job["spec"]["pytorchReplicaSpecs"].items():
        template = replica["template"]
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {**template["metadata"], "name": f"pt-1-{role.lower()}-0", "namespace": "ml"},
            "spec": {**template["spec"], "restartPolicy": replica["restartPolicy"]},
        }
        _validate(pod)


def test_the_validator_rejects_what_the_server_would() -> None:
    """The check can fail: a misspelt field, a string where an integer belongs, an integer where a string does
    (an environment value; a quantity's format is the server's own check, not the schema's)."""
    spec = SPECS["gpu stage with limits"]
    good = pod_manifest(spec, ["posttrain", "rl-round"], {}, "p", "ml")
    typo = {**good, "spec": {**good["spec"], "activeDeadlineSecond": 60}}
    wrong_type = {**good, "spec": {**good["spec"], "activeDeadlineSeconds": "an hour"}}
    container = {**good["spec"]["containers"][0], "env": [{"name": "POSTTRAIN_SEED", "value": 3}]}
    bad_env = {**good, "spec": {**good["spec"], "containers": [container]}}
    for manifest in (typo, wrong_type, bad_env):
        with pytest.raises(kubernetes_validate.ValidationError):
            _validate(manifest)
