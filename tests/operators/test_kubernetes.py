"""Kubernetes launcher: the pod manifest (pure), and the pod lifecycle against a spec'd CoreV1Api mock."""

from __future__ import annotations

from unittest import mock

import pytest

from operators.launchers.kubernetes import KubernetesLauncher, pod_manifest
from operators.spec import StageSpec

kubernetes = pytest.importorskip("kubernetes")


def test_pod_manifest_requests_gpus_and_limits() -> None:
    spec = StageSpec("rl-round", launcher="kubernetes", image="reg/posttrain-train:1", gpus=4, memory="64Gi",
                     cpus=16, timeout_s=3600)
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
        StageSpec("sft", launcher="kubernetes"), ["posttrain", "sft"], {}, lines.append)
    assert rc == 3 and lines == ["a", "POSTTRAIN_RESULT {}"]
    name = api.create_namespaced_pod.call_args.kwargs["body"]["metadata"]["name"]
    assert name.startswith("posttrain-sft-")
    api.delete_namespaced_pod.assert_called_once_with(name=name, namespace="ml", grace_period_seconds=10)
