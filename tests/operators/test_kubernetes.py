"""Kubernetes launcher: the pod manifest (pure), and the pod lifecycle against a spec'd CoreV1Api mock."""

from __future__ import annotations

from unittest import mock

import pytest

from operators.launchers.kubernetes import KubernetesLauncher, pod_manifest
from operators.spec import StageSpec

kubernetes = pytest.importorskip("kubernetes")


def test_pod_manifest_requests_gpus_and_limits() -> None:
    spec = StageSpec(
        "rl-round", launcher="kubernetes", image="reg/posttrain-train:1", gpus=4, memory="64Gi", cpus=16, timeout_s=3600
    )
    pod = pod_manifest(spec, ["posttrain", "rl-round"], {"B": "2", "A": "1"}, "p1", "ml", "trainer")
    container = pod["spec"]["containers"][0]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "4", "memory": "64Gi", "cpu": "16"}
    assert container["command"] == ["posttrain", "rl-round"] and container["image"] == "reg/posttrain-train:1"
    assert container["env"] == [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]
    assert pod["spec"]["restartPolicy"] == "Never" and pod["spec"]["activeDeadlineSeconds"] == 3600
    assert pod["spec"]["serviceAccountName"] == "trainer" and pod["spec"]["tolerations"][0]["key"] == "nvidia.com/gpu"
    cpu_pod = pod_manifest(StageSpec("gate", launcher="kubernetes"), ["posttrain"], {}, "p2", "ml")
    assert "tolerations" not in cpu_pod["spec"] and cpu_pod["spec"]["containers"][0]["resources"]["limits"] == {}


def _status(phase, exit_code=None):
    term = mock.Mock(exit_code=exit_code) if exit_code is not None else None
    cs = [mock.Mock(state=mock.Mock(terminated=term))] if exit_code is not None else []
    return mock.Mock(status=mock.Mock(phase=phase, container_statuses=cs))


def test_pod_lifecycle_streams_logs_and_deletes_pod() -> None:
    api = mock.Mock(spec=kubernetes.client.CoreV1Api)
    api.read_namespaced_pod_status.side_effect = [_status("Pending"), _status("Running"), _status("Failed", 3)]
    stream = mock.Mock()
    stream.stream.return_value = iter([b"a\nPOSTTRAIN_", b"RESULT {}\n"])
    api.read_namespaced_pod_log.return_value = stream
    lines: list[str] = []
    rc = KubernetesLauncher(api, namespace="ml", poll_s=0).run(
        StageSpec("sft", launcher="kubernetes"), ["posttrain", "sft"], {}, lines.append
    )
    assert rc == 3 and lines == ["a", "POSTTRAIN_RESULT {}"]
    name = api.create_namespaced_pod.call_args.kwargs["body"]["metadata"]["name"]
    assert name.startswith("posttrain-sft-")
    api.delete_namespaced_pod.assert_called_once_with(name=name, namespace="ml", grace_period_seconds=10)


def test_multi_node_form_is_a_pytorchjob_with_c10d_rendezvous() -> None:
    from operators.launchers.kubernetes import pytorchjob_manifest

    spec = StageSpec("rl-round", launcher="kubernetes", gpus=8, nproc_per_node=8, nnodes=3, timeout_s=7200)
    argv = spec.argv("s3://b/runs/r1", None)
    assert argv[:9] == [
        "torchrun",
        "--nproc-per-node",
        "8",
        "--nnodes",
        "3",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "$(MASTER_ADDR):29500",
    ]
    assert argv[-6:] == ["-m", "training.cli", "--", "rl-round", "--run", "s3://b/runs/r1"]
    job = pytorchjob_manifest(spec, argv, {"A": "1"}, "pt-1", "ml")
    assert job["kind"] == "PyTorchJob" and job["spec"]["nprocPerNode"] == "8"
    replicas = job["spec"]["pytorchReplicaSpecs"]
    assert replicas["Master"]["replicas"] == 1 and replicas["Worker"]["replicas"] == 2
    container = replicas["Worker"]["template"]["spec"]["containers"][0]
    assert container["name"] == "pytorch" and container["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert {"name": "POSTTRAIN_RDZV_ID", "value": "pt-1"} in container["env"]
    assert job["spec"]["runPolicy"] == {"backoffLimit": 0, "activeDeadlineSeconds": 7200}
    with pytest.raises(ValueError, match="PyTorchJob"):
        KubernetesLauncher(core_v1=mock.Mock()).run(spec, argv, {}, print)


def test_one_node_pod_runs_torchrun_standalone_with_a_gpu_per_process() -> None:
    spec = StageSpec("sft", launcher="kubernetes", gpus=1, nproc_per_node=4)
    argv = spec.argv("s3://b/r", None)
    assert argv == [
        "torchrun",
        "--nproc-per-node",
        "4",
        "--standalone",
        "-m",
        "training.cli",
        "--",
        "sft",
        "--run",
        "s3://b/r",
    ]
    api = mock.Mock()
    api.read_namespaced_pod_status.return_value = _status("Succeeded", 0)
    assert KubernetesLauncher(core_v1=api, poll_s=0).run(spec, argv, {}, print) == 0
    body = api.create_namespaced_pod.call_args.kwargs["body"]
    assert body["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "4"
