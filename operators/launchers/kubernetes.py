"""Run a stage as a Kubernetes pod (a GPU node pool in production).

The pod is a plain `restartPolicy: Never` pod: Airflow owns retries, and a retry is a new pod that resumes the
stage from its checkpoints in object storage. GPUs are requested as `nvidia.com/gpu` limits.

One node, N processes (`StageSpec.nproc_per_node`): the same pod, its command `torchrun --standalone
--nproc-per-node N -m training.cli -- <stage> ...`, N GPUs. Several nodes (`nnodes` > 1): the documented form is
a Kubeflow PyTorchJob (`pytorchjob_manifest`): one Master and nnodes-1 Worker replicas of that pod, each running
torchrun with c10d rendezvous at $(MASTER_ADDR):rdzv_port (the training operator sets MASTER_ADDR on every
replica), the job name as the rendezvous id. Submit it with `kubectl apply -f` (or the CustomObjectsApi);
`KubernetesLauncher` itself runs single-node pods and refuses nnodes > 1, naming this function.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from operators.launchers.base import StageTimeout
from operators.spec import StageSpec


def pod_manifest(
    spec: StageSpec, argv: list[str], env: dict[str, str], name: str, namespace: str, service_account: str | None = None
) -> dict[str, Any]:
    """The pod as a plain dict (what `kubectl apply` would take); pure, so it is testable without a cluster."""
    limits: dict[str, str] = {}
    requests: dict[str, str] = {}
    if spec.gpus:
        limits["nvidia.com/gpu"] = str(spec.gpus)
    if spec.memory:
        limits["memory"] = requests["memory"] = spec.memory
    if spec.cpus:
        limits["cpu"] = requests["cpu"] = str(spec.cpus)
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/name": "posttrain", "posttrain/stage": spec.command},
        },
        "spec": {
            "restartPolicy": "Never",
            "activeDeadlineSeconds": spec.timeout_s,
            "containers": [
                {
                    "name": "stage",
                    "image": spec.image,
                    "command": argv,
                    "env": [{"name": k, "value": v} for k, v in sorted(env.items())],
                    "resources": {"limits": limits, "requests": requests},
                    "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
                }
            ],
            # torch dataloaders / NCCL need a larger /dev/shm than the container default.
            "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}],
        },
    }
    if spec.gpus:
        pod["spec"]["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    if service_account:
        pod["spec"]["serviceAccountName"] = service_account
    return pod


def pytorchjob_manifest(
    spec: StageSpec, argv: list[str], env: dict[str, str], name: str, namespace: str, service_account: str | None = None
) -> dict[str, Any]:
    """The multi-node form of a stage (kubeflow.org/v1 PyTorchJob): Master + (nnodes - 1) Workers, each the
    stage pod with `spec.nproc_per_node` GPUs running torchrun (argv from StageSpec.argv, c10d rendezvous)."""
    pod = pod_manifest(
        spec.with_(gpus=max(spec.gpus, spec.nproc_per_node)),
        argv,
        {**env, "POSTTRAIN_RDZV_ID": name},
        name,
        namespace,
        service_account,
    )
    container = pod["spec"]["containers"][0]
    container["name"] = "pytorch"  # the training operator finds the container by this name
    container["ports"] = [{"name": "rdzv", "containerPort": spec.rdzv_port}]
    template = {
        "metadata": {"labels": pod["metadata"]["labels"]},
        "spec": {k: v for k, v in pod["spec"].items() if k not in ("restartPolicy", "activeDeadlineSeconds")},
    }

    def replicas(n: int) -> dict[str, Any]:
        return {"replicas": n, "restartPolicy": "Never", "template": template}

    job: dict[str, Any] = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": namespace, "labels": pod["metadata"]["labels"]},
        "spec": {
            "runPolicy": {"backoffLimit": 0, "activeDeadlineSeconds": spec.timeout_s},  # Airflow owns retries
            "nprocPerNode": str(spec.nproc_per_node),
            "pytorchReplicaSpecs": {"Master": replicas(1)},
        },
    }
    if spec.nnodes > 1:
        job["spec"]["pytorchReplicaSpecs"]["Worker"] = replicas(spec.nnodes - 1)
    return job


class KubernetesLauncher:
    """`core_v1` is a kubernetes `CoreV1Api` (from in-cluster or kubeconfig credentials by default)."""

    def __init__(
        self, core_v1: Any = None, namespace: str = "posttrain", service_account: str | None = None, poll_s: float = 2.0
    ) -> None:
        self._api = core_v1
        self.namespace = namespace
        self.service_account = service_account
        self.poll_s = poll_s
        self.pod_name: str | None = None
        self._lock = threading.Lock()

    @property
    def api(self) -> Any:
        if self._api is None:
            from kubernetes import client, config

            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
            self._api = client.CoreV1Api()
        return self._api

    def run(self, spec: StageSpec, argv: list[str], env: dict[str, str], on_line: Callable[[str], None]) -> int:
        if spec.nnodes > 1:
            raise ValueError(
                f"stage {spec.command}: nnodes={spec.nnodes} runs as a PyTorchJob "
                "(operators.launchers.kubernetes.pytorchjob_manifest); this launcher runs one pod"
            )
        name = f"posttrain-{spec.command}-{uuid.uuid4().hex[:8]}".lower()
        spec = spec.with_(gpus=max(spec.gpus, spec.nproc_per_node) if spec.gpus else 0)
        manifest = pod_manifest(spec, argv, env, name, self.namespace, self.service_account)
        with self._lock:
            self.api.create_namespaced_pod(namespace=self.namespace, body=manifest)
            self.pod_name = name
        deadline = time.monotonic() + spec.timeout_s
        try:
            phase = self._wait_started(name, deadline)
            if phase not in ("Succeeded", "Failed"):
                stream = self.api.read_namespaced_pod_log(
                    name=name, namespace=self.namespace, container="stage", follow=True, _preload_content=False
                )
                pending = ""
                for chunk in stream.stream():
                    pending += chunk.decode("utf-8", errors="replace")
                    *lines, pending = pending.split("\n")
                    for line in lines:
                        on_line(line)
                if pending:
                    on_line(pending)
            while True:
                status = self.api.read_namespaced_pod_status(name=name, namespace=self.namespace).status
                if status.phase in ("Succeeded", "Failed"):
                    break
                if time.monotonic() > deadline:
                    raise StageTimeout(f"stage {spec.command} exceeded its timeout of {spec.timeout_s}s")
                time.sleep(self.poll_s)
            terminated = status.container_statuses[0].state.terminated if status.container_statuses else None
            return int(terminated.exit_code) if terminated is not None else (0 if status.phase == "Succeeded" else 1)
        finally:
            self.stop()

    def _wait_started(self, name: str, deadline: float) -> str:
        while True:
            phase = self.api.read_namespaced_pod_status(name=name, namespace=self.namespace).status.phase
            if phase != "Pending":
                return phase
            if time.monotonic() > deadline:
                raise StageTimeout(f"pod {name} still Pending at the stage timeout (no GPU node free?)")
            time.sleep(self.poll_s)

    def stop(self) -> None:
        with self._lock:
            name, self.pod_name = self.pod_name, None
        if name is None:
            return
        from kubernetes.client.rest import ApiException

        try:
            self.api.delete_namespaced_pod(name=name, namespace=self.namespace, grace_period_seconds=10)
        except ApiException as err:
            if err.status != 404:
                raise
