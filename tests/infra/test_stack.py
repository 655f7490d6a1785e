"""The embedded local stack: real servers up, healthy, and `down` stops exactly what `up` started."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from infra.local.stack import BUCKETS, DEV_ACCESS_KEY, DEV_SECRET_KEY, Stack, StackError, free_port

REPO = Path(__file__).resolve().parents[2]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie child of ours counts as gone
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _group_members(pgid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


@pytest.mark.slow
def test_up_status_down_full_stack(tmp_path: Path) -> None:
    ports = {"s3": free_port(), "mlflow": free_port(), "airflow": free_port()}
    stack = Stack(tmp_path / "state", ports)
    # A bystander on the same machine that the stack must never touch.
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
    try:
        cli = [sys.executable, str(REPO / "infra/local/stack.py"), "--state-dir", str(tmp_path / "state")]
        cli += [f"--port-{k}={v}" for k, v in ports.items()]
        up = subprocess.run(cli + ["up"], capture_output=True, text=True, timeout=400)
        assert up.returncode == 0, up.stderr + up.stdout
        assert f"http://127.0.0.1:{ports['airflow']}" in up.stdout and "password" in up.stdout

        status = stack.status()
        assert all(s["healthy"] and s["pid"] for s in status.values()), status
        # Airflow's own health endpoint says the scheduler and DAG processor report in.
        deadline = time.monotonic() + 60
        while True:
            health = json.load(urllib.request.urlopen(f"{stack.airflow_url}/api/v2/monitor/health", timeout=5))
            if health["scheduler"]["status"] == "healthy" and health["dag_processor"]["status"] == "healthy":
                break
            assert time.monotonic() < deadline, health
            time.sleep(2)
        # Every service listens on the loopback address only (the default host).
        assert {n: _listening(p) for n, p in ports.items()} == dict.fromkeys(ports, {"127.0.0.1"})
        # Running `up` again is idempotent: nothing restarts.
        pids = {n: s["pid"] for n, s in status.items()}
        again = subprocess.run(cli + ["up"], capture_output=True, text=True, timeout=120)
        assert again.returncode == 0 and "already running" in again.stdout
        assert {n: s["pid"] for n, s in stack.status().items()} == pids
        env_file = (tmp_path / "state" / "env").read_text()
        assert f"MLFLOW_TRACKING_URI=http://127.0.0.1:{ports['mlflow']}" in env_file

        groups = [
            os.getpgid(stack.running_pid(n))
            for n in ("s3", "mlflow", "airflow", "airflow-scheduler", "airflow-dag-processor")
        ]
        assert all(_group_members(g) for g in groups)
        down = subprocess.run(cli + ["down"], capture_output=True, text=True, timeout=120)
        assert down.returncode == 0, down.stderr
        for g in groups:  # every process of every group, workers included, is gone
            deadline = time.monotonic() + 10
            while _group_members(g) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert _group_members(g) == [], f"process group {g} left processes behind"
        assert _alive(bystander.pid)
        assert not any(s["pid"] for s in stack.status().values())
    finally:
        stack.down(quiet=True)
        bystander.send_signal(signal.SIGKILL)
        bystander.wait()


@pytest.mark.slow
def test_s3_answers_only_with_its_buckets(tmp_path: Path) -> None:
    """The first HTTP answer the S3 server ever gives already finds its buckets: no client (one retrying
    through the start-up, say) can land between "listening" and "buckets created" and get NoSuchBucket."""
    import boto3
    from botocore.config import Config
    from botocore.exceptions import ClientError

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # Built beforehand, with no retries: the HEADs must follow the first answer at once, and a 404 must show.
    s3 = boto3.client(
        "s3",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id=DEV_ACCESS_KEY,
        aws_secret_access_key=DEV_SECRET_KEY,
        config=Config(retries={"total_max_attempts": 1}, connect_timeout=5, read_timeout=10),
    )
    stop = threading.Event()
    seen: dict[str, object] = {}

    def poll() -> None:
        while not stop.is_set():
            try:
                urllib.request.urlopen(f"{url}/", timeout=2).close()
            except urllib.error.HTTPError:
                pass  # an HTTP error is an answer too: the server is serving
            except OSError:
                time.sleep(0.005)  # not listening yet: poll again, tightly, to catch the earliest moment
                continue
            for bucket in BUCKETS:
                try:
                    s3.head_bucket(Bucket=bucket)
                    seen[bucket] = "ok"
                except ClientError as err:
                    seen[bucket] = err.response["Error"]
            return

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    stack = Stack(tmp_path, ports={"s3": port})
    try:
        stack.up(("s3",), quiet=True)
        poller.join(timeout=30)
        assert not poller.is_alive(), "the poller never got an answer from the S3 server"
        assert seen == dict.fromkeys(BUCKETS, "ok")
    finally:
        stop.set()
        poller.join(timeout=10)
        stack.down(quiet=True)


def test_bucket_check_waits_for_a_late_s3_server_and_names_one_that_never_answers(tmp_path: Path) -> None:
    """`up`'s bucket check rides out a server that is slow to answer its first requests (a busy machine), and one
    that never answers fails `up` with the bucket named rather than a socket timeout. The servers here are stand-ins
    (a listener that only answers after a second, one that never answers): a stalled s3rver cannot be caused."""
    import http.server
    import socket

    class Buckets(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self) -> None:  # noqa: N802 (the name http.server calls)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    port = free_port()
    late = http.server.ThreadingHTTPServer(("127.0.0.1", port), Buckets, bind_and_activate=False)
    late.allow_reuse_address = True

    def serve_after_a_second() -> None:
        time.sleep(1.0)  # until then a connection is refused, as by a server still starting
        late.server_bind()
        late.server_activate()
        late.serve_forever(poll_interval=0.05)

    threading.Thread(target=serve_after_a_second, daemon=True).start()
    try:
        Stack(tmp_path / "late", ports={"s3": port})._check_buckets(answer_within_s=20)
    finally:
        late.shutdown()
        late.server_close()

    with socket.socket() as silent:  # accepts connections (the kernel's backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        stack = Stack(tmp_path / "silent", ports={"s3": silent.getsockname()[1]})
        started = time.monotonic()
        with pytest.raises(StackError, match=rf"s3 did not answer for bucket\(s\) {BUCKETS[0]}.* within 1.5 s"):
            stack._check_buckets(answer_within_s=1.5)
        assert time.monotonic() - started < 1.5 * len(BUCKETS) + 10


def test_port_taken_by_a_stranger_is_refused(tmp_path: Path) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        stack = Stack(tmp_path, {"s3": port})
        with pytest.raises(StackError, match=f"port {port} for s3 is taken"):
            stack.up(("s3",), quiet=True)


def test_down_ignores_recycled_pid(tmp_path: Path) -> None:
    """A pid file whose process has gone (and whose pid may be reused) must not lead `down` to kill anyone."""
    stack = Stack(tmp_path)
    stack.run_dir.mkdir(parents=True)
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        (stack.run_dir / "s3.pid").write_text(f"{victim.pid} 1")  # right pid, wrong start time
        assert stack.running_pid("s3") is None
        stack.down(quiet=True)
        assert _alive(victim.pid)
    finally:
        victim.kill()
        victim.wait()


def test_s3_keeps_objects_across_restarts_and_a_wiped_s3_starts_mlflow_over(tmp_path: Path) -> None:
    """S3 is file-backed: a restart (as after `make down` or a reboot) finds every object and MLflow keeps its
    store. Only an S3 data folder that is new (wiped, or from before S3 kept files) starts MLflow over, the old
    store kept: a champion alias never outlives its checkpoint."""
    import shutil

    import boto3
    from mlflow import MlflowClient

    stack = Stack(tmp_path / "state", {"s3": free_port(), "mlflow": free_port()})
    try:
        stack.up(("s3", "mlflow"), quiet=True)
        s3 = boto3.client(
            "s3",
            endpoint_url=stack.s3_url,
            region_name="us-east-1",
            aws_access_key_id=DEV_ACCESS_KEY,
            aws_secret_access_key=DEV_SECRET_KEY,
        )
        s3.put_object(Bucket="posttrain", Key="runs/r1/rl_round_2/model/weights.bin", Body=b"w" * 1000)
        client = MlflowClient(stack.mlflow_url)
        client.create_registered_model("tiny")
        version = client.create_model_version("tiny", "s3://posttrain/runs/r1/rl_round_2")
        client.set_registered_model_alias("tiny", "champion", version.version)
        mlflow_pid = stack.running_pid("mlflow")

        stack.down(only=("s3",), quiet=True)  # S3 gone (as after a reboot); MLflow still up
        stack.up(("s3",), quiet=True)
        assert stack.running_pid("mlflow") == mlflow_pid  # S3 kept its data: nothing to start over
        body = s3.get_object(Bucket="posttrain", Key="runs/r1/rl_round_2/model/weights.bin")["Body"].read()
        assert body == b"w" * 1000
        assert client.get_model_version_by_alias("tiny", "champion").version == version.version
        assert not list((tmp_path / "state" / "mlflow").glob("mlflow.db.before-s3-restart-*"))

        stack.down(only=("s3",), quiet=True)
        shutil.rmtree(stack.s3_dir)  # S3's data wiped: MLflow, which was running, comes back on a fresh store
        stack.up(("s3",), quiet=True)
        assert stack.running_pid("mlflow") not in (None, mlflow_pid)
        assert client.search_registered_models() == []
        kept = list((tmp_path / "state" / "mlflow").glob("mlflow.db.before-s3-restart-*"))
        assert len(kept) == 1 and stack.mlflow_db.exists()

        pid = stack.running_pid("mlflow")
        stack.up(("s3", "mlflow"), quiet=True)  # S3 still up: nothing is reset
        assert stack.running_pid("mlflow") == pid
        assert len(list((tmp_path / "state" / "mlflow").glob("mlflow.db.before-s3-restart-*"))) == 1
    finally:
        stack.down(quiet=True)


def _listening(port: int) -> set[str]:
    """The local addresses with a socket listening on `port` (IPv4 and IPv6), from /proc/net/tcp*."""
    import ipaddress

    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            addr_hex, port_hex = local.split(":")
            if state != "0A" or int(port_hex, 16) != port:  # 0A = LISTEN
                continue
            raw = bytes.fromhex(addr_hex)
            # The kernel prints each 32-bit word in host (little-endian) order.
            raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
            found.add(str(ipaddress.ip_address(raw)))
    return found
