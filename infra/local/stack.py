"""The embedded local stack: an S3-compatible server, an MLflow tracking server and Airflow 3.

    python infra/local/stack.py up [--services s3,mlflow,airflow]   # start (idempotent)
    python infra/local/stack.py status
    python infra/local/stack.py down                                  # stops only what `up` started
    python infra/local/stack.py env                                   # shell exports for the stack
    python infra/local/stack.py up --executor celery [--queues gpu,cpu,sandbox]   # Airflow scaled out

Everything lives under one project-local state folder (default `.local/`): pid files, logs, the MLflow
SQLite database, AIRFLOW_HOME, and `env` (the exports a stage or a shell needs to reach the stack).

The S3 server is s3rver (npm, started through `s3_server.py`): MinIO cannot be installed from the package
registries this project may use, so s3rver is the dev/CI stand-in for MinIO (the compose file in infra/ runs real
MinIO). Everything speaks to it with plain boto3 and an endpoint URL, exactly as it would to MinIO or AWS. It keeps
every object as a file under `<state>/s3`, so models, checkpoints and MLflow artifacts survive `down` / `up` and a
reboot, and it creates its buckets before it listens: once S3 answers at all, its buckets are there.

Every service listens on 127.0.0.1 unless `--host` (or POSTTRAIN_STACK_HOST) says otherwise.

Executors (`--executor`, or POSTTRAIN_EXECUTOR; default `local`):
- `local`: Airflow's LocalExecutor on SQLite; the scheduler runs every task itself.
- `celery`: Airflow's CeleryExecutor, as on a cluster: a real PostgreSQL server (initdb'd under
  `<state>/postgres`, run as the `postgres` user when the stack runs as root, because PostgreSQL refuses root)
  holds Airflow's metadata and Celery's results, a real `redis-server` is the broker, and one
  `airflow celery worker` per queue (`--queues`, default gpu,cpu,sandbox as operators/queues.py names them)
  runs the tasks of that queue only, one at a time. Both servers listen on 127.0.0.1 only, on their own ports,
  with passwords generated into `<state>/secrets.json`; nothing runs as a system service.

Each service runs in its own session (process group), so `down` stops the whole group: `airflow api-server`
and `mlflow server` fork workers that would otherwise outlive their parent. A pid file records the process start
time too, so a recycled pid is never mistaken for ours.

Standard library only: this runs before (and without) the project being importable.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFAULT_STATE = REPO / ".local"
ALL_SERVICES = ("s3", "mlflow", "airflow")
DEFAULT_PORTS = {"s3": 9000, "mlflow": 5000, "airflow": 8080, "postgres": 15432, "redis": 16379}
EXECUTORS = ("local", "celery")
# What the CeleryExecutor needs besides Airflow, started before it (and stopped after it).
CELERY_BACKENDS = ("postgres", "redis")
# The queue names, read from the same variables with the same defaults as operators/queues.py (this file
# imports nothing from the project; tests/operators/test_queues.py checks the two agree).
QUEUE_ENV = {"gpu": "POSTTRAIN_QUEUE_GPU", "cpu": "POSTTRAIN_QUEUE_CPU", "sandbox": "POSTTRAIN_QUEUE_SANDBOX"}
WORKER_PREFIX = "celery-worker-"
BUCKETS = ("posttrain", "mlflow")
# s3rver's one built-in account (see s3_server.py): dev credentials, not secrets.
DEV_ACCESS_KEY = "S3RVER"
DEV_SECRET_KEY = "S3RVER"
DEFAULT_HOST = os.environ.get("POSTTRAIN_STACK_HOST", "127.0.0.1")
# Written into the S3 data folder once S3 has started on it: a data folder without it is new (or was wiped), and
# then an MLflow store from before cannot be trusted (its artifacts and registered checkpoints were not in it).
S3_MARKER = ".posttrain-s3-data"
AIRFLOW_USER = "admin"


class StackError(RuntimeError):
    pass


@dataclass
class Service:
    name: str
    argv: list[str]
    health_url: str
    env: dict[str, str] = field(default_factory=dict)
    start_timeout_s: float = 120.0
    # Helpers started alongside the main process (e.g. Airflow's scheduler); they share its lifetime.
    companions: list[tuple[str, list[str]]] = field(default_factory=list)
    # Extra environment of one companion (a Celery worker's name), over `env`.
    companion_env: dict[str, dict[str, str]] = field(default_factory=dict)
    # A health check for a service that does not speak HTTP (PostgreSQL, Redis); else GET health_url.
    probe: Callable[[], bool] | None = None
    # Run as this user: PostgreSQL refuses to run as root.
    user: str | None = None

    def healthy(self) -> bool:
        return self.probe() if self.probe is not None else _healthy(self.health_url)


def queue_name(kind: str) -> str:
    """The queue of a kind of worker (gpu, cpu, sandbox), as operators/queues.py reads it."""
    return os.environ.get(QUEUE_ENV[kind], "").strip() or kind


def default_queues() -> tuple[str, ...]:
    return tuple(queue_name(kind) for kind in QUEUE_ENV)


def worker_name(queue: str) -> str:
    """The name a Celery worker of the local stack reports as its host (task instances' `hostname`)."""
    return f"{queue}-worker"


def worker_hostname() -> str:
    """Airflow's [core] hostname_callable in the stack's Celery workers. Every worker of the local stack is on
    the same machine, so the machine's name would not tell them apart; each worker's environment names it
    instead, and a task instance's `hostname` then says which worker ran it (on separate hosts it is the FQDN)."""
    return os.environ.get("POSTTRAIN_WORKER_HOSTNAME") or socket.getfqdn()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _bin(name: str) -> str:
    """Prefer the console script next to the running interpreter (the project venv)."""
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else name


def _proc_start_time(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Field 22 (starttime) counted after the parenthesised command name, which may contain spaces.
    return stat.rsplit(")", 1)[1].split()[19]


class Stack:
    """Start, inspect and stop the local services, all state under `state_dir`."""

    def __init__(
        self,
        state_dir: Path = DEFAULT_STATE,
        ports: dict[str, int] | None = None,
        host: str = DEFAULT_HOST,
        executor: str | None = None,
        queues: tuple[str, ...] | None = None,
    ) -> None:
        self.state = Path(state_dir).resolve()
        # Where the services listen; clients always use 127.0.0.1 (a wildcard host still answers there).
        self.host = host
        self.run_dir = self.state / "run"
        self.log_dir = self.state / "logs"
        self.ports = dict(DEFAULT_PORTS)
        self.ports.update(self._saved_ports())
        self.ports.update(ports or {})
        # Asked for > POSTTRAIN_EXECUTOR > what the running Airflow was started with > local.
        saved = self._saved_executor()
        self.executor = executor or os.environ.get("POSTTRAIN_EXECUTOR") or saved.get("executor") or "local"
        if self.executor not in EXECUTORS:
            raise StackError(f"executor {self.executor!r} is not one of {', '.join(EXECUTORS)}")
        self.queues = tuple(queues or saved.get("queues") or default_queues())

    # ----- addresses -------------------------------------------------------------------------------------
    @property
    def s3_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3']}"

    @property
    def mlflow_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['mlflow']}"

    @property
    def airflow_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['airflow']}"

    def url(self, name: str) -> str:
        if name in CELERY_BACKENDS:
            return f"{'postgresql' if name == 'postgres' else 'redis'}://127.0.0.1:{self.ports[name]}"
        return {"s3": self.s3_url, "mlflow": self.mlflow_url, "airflow": self.airflow_url}[name]

    @property
    def celery(self) -> bool:
        return self.executor == "celery"

    def _secret(self, name: str) -> str:
        """A password generated on first use and kept in `<state>/secrets.json` (readable by its owner only)."""
        path = self.state / "secrets.json"
        try:
            saved = json.loads(path.read_text())
        except (OSError, ValueError):
            saved = {}
        if name not in saved:
            saved[name] = secrets.token_hex(16)
            self.state.mkdir(parents=True, exist_ok=True)
            path.touch(mode=0o600)
            path.write_text(json.dumps(saved))
        return str(saved[name])

    @property
    def database_url(self) -> str:
        return f"postgresql+psycopg2://airflow:{self._secret('postgres')}@127.0.0.1:{self.ports['postgres']}/airflow"

    @property
    def broker_url(self) -> str:
        return f"redis://:{self._secret('redis')}@127.0.0.1:{self.ports['redis']}/0"

    @property
    def airflow_home(self) -> Path:
        return self.state / "airflow"

    @property
    def s3_dir(self) -> Path:
        """Where S3 keeps its objects (one folder per bucket, one file per object)."""
        return self.state / "s3"

    def client_env(self) -> dict[str, str]:
        """What a stage, a test or a shell needs to talk to this stack."""
        return {
            "AWS_ACCESS_KEY_ID": DEV_ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": DEV_SECRET_KEY,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL_S3": self.s3_url,
            "MLFLOW_S3_ENDPOINT_URL": self.s3_url,
            "MLFLOW_TRACKING_URI": self.mlflow_url,
            "POSTTRAIN_RUN_ROOT": "s3://posttrain/runs",
            "AIRFLOW_HOME": str(self.airflow_home),
        }

    def airflow_env(self) -> dict[str, str]:
        api = self.airflow_url
        return {
            **self.client_env(),
            "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            # Two cores: keep concurrency low so a stage is not starved by its neighbours.
            "AIRFLOW__CORE__PARALLELISM": "2",
            "AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG": "2",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{api}/execution/",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{AIRFLOW_USER}:admin",
            "AIRFLOW__API__HOST": self.host,
            # The "Checkpoint" link opens the stage folder in the storage browser the Airflow plugin serves.
            "POSTTRAIN_BROWSE_URL": f"{api}/posttrain/browse?uri={{uri}}",
            "AIRFLOW__API__PORT": str(self.ports["airflow"]),
            "AIRFLOW__API__BASE_URL": api,
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{self.airflow_home / 'airflow.db'}",
            "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(self.airflow_home / "logs"),
            "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "False",
            # Crash recovery within about a minute instead of five (tests/e2e/test_crash_recovery.py measures it).
            # A dead scheduler's running tasks are reset (and retried) by the next scheduler once its job missed
            # heartbeats for scheduler_health_check_threshold (30 s, the default; 6 missed 5 s beats), checked every
            # 15 s instead of 300 s. A task whose worker died is failed (then retried) after 60 s without a
            # heartbeat (default 300 s; the worker beats every 5 s), checked every 5 s instead of 10 s. Costs: a
            # few more small DB queries a minute, and a machine stalled past 60 s (swap, a frozen VM) has its
            # tasks retried while they still run; the stage lease (training/lease.py) then stops the old attempt,
            # and the retry resumes from the last checkpoint.
            "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD": "30",
            "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "15",
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "60",
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "5",
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "30",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
            **(self._celery_env() if self.celery else {}),
        }

    def _celery_env(self) -> dict[str, str]:
        """What the CeleryExecutor mode changes in every Airflow component's environment."""
        return {
            "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": self.database_url,
            "AIRFLOW__CELERY__BROKER_URL": self.broker_url,
            "AIRFLOW__CELERY__RESULT_BACKEND": "db+" + self.database_url,
            # A task that names no queue goes to the cpu workers (Airflow's own default, "default", has none).
            "AIRFLOW__OPERATORS__DEFAULT_QUEUE": queue_name("cpu"),
            # A stage may run for hours (6 h by default, StageSpec.timeout_s): Redis must not hand its task to a
            # second worker meanwhile. Said explicitly: the Celery provider warns when it is left unset.
            "AIRFLOW__CELERY_BROKER_TRANSPORT_OPTIONS__VISIBILITY_TIMEOUT": str(24 * 3600),
            # Sending a task to Redis can take over the 1 s default on a busy 2-core machine.
            "AIRFLOW__CELERY__OPERATION_TIMEOUT": "10",
        }

    def airflow_password(self) -> str | None:
        path = self.airflow_home / "simple_auth_manager_passwords.json.generated"
        try:
            return json.loads(path.read_text()).get(AIRFLOW_USER)
        except (OSError, ValueError):
            return None

    # ----- service definitions ---------------------------------------------------------------------------
    def _service(self, name: str) -> Service:
        if name == "s3":
            # Not PUTs after it is healthy: a client retrying through the start-up could land in between and get
            # NoSuchBucket. The server creates the buckets before it binds the port.
            argv = [
                sys.executable,
                str(REPO / "infra" / "local" / "s3_server.py"),
                "--host",
                self.host,
                "--port",
                str(self.ports["s3"]),
                "--data-dir",
                str(self.s3_dir),
            ]
            for bucket in BUCKETS:
                argv += ["--bucket", bucket]
            return Service("s3", argv, f"{self.s3_url}/", start_timeout_s=60)
        if name == "mlflow":
            db = self.mlflow_db
            db.parent.mkdir(parents=True, exist_ok=True)
            return Service(
                "mlflow",
                [
                    _bin("mlflow"),
                    "server",
                    "--backend-store-uri",
                    f"sqlite:///{db}",
                    "--artifacts-destination",
                    "s3://mlflow/artifacts",
                    "--serve-artifacts",
                    "--host",
                    self.host,
                    "--port",
                    str(self.ports["mlflow"]),
                    "--workers",
                    "1",
                ],
                f"{self.mlflow_url}/health",
                # MLflow's job runner (a Huey consumer per worker pool, for GenAI evaluation jobs and trace
                # roll-ups) is five more Python processes that import MLflow at start; posttrain submits no
                # MLflow jobs, so the stack runs the tracking server alone.
                env={**self.client_env(), "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
                start_timeout_s=120,
            )
        if name == "airflow":
            env = self.airflow_env()
            companions = [
                ("airflow-scheduler", [_bin("airflow"), "scheduler"]),
                ("airflow-dag-processor", [_bin("airflow"), "dag-processor"]),
            ]
            companion_env = {}
            if self.celery:
                for queue in self.queues:
                    # One task at a time per worker (2 cores); no gossip or mingle between workers, which only
                    # slows their start; no log server: every worker writes to the same local log folder, which
                    # the api-server reads directly.
                    companions.append(
                        (
                            WORKER_PREFIX + queue,
                            [
                                _bin("airflow"),
                                "celery",
                                "worker",
                                "--queues",
                                queue,
                                "--concurrency",
                                "1",
                                "--celery-hostname",
                                f"{worker_name(queue)}@%h",
                                "--skip-serve-logs",
                                "--without-mingle",
                                "--without-gossip",
                            ],
                        )
                    )
                    companion_env[WORKER_PREFIX + queue] = {
                        "POSTTRAIN_WORKER_HOSTNAME": worker_name(queue),
                        "AIRFLOW__CORE__HOSTNAME_CALLABLE": "infra.local.stack.worker_hostname",
                    }
            return Service(
                "airflow",
                [_bin("airflow"), "api-server", "--host", self.host, "--port", str(self.ports["airflow"])],
                f"{self.airflow_url}/api/v2/monitor/health",
                env=env,
                start_timeout_s=180,
                companions=companions,
                companion_env=companion_env,
            )
        if name == "postgres":
            data = self.state / "postgres" / "data"
            return Service(
                "postgres",
                # TCP on the loopback only (no Unix socket: its default folder belongs to a system service).
                [
                    _pg_bin("postgres"),
                    "-D",
                    str(data),
                    "-p",
                    str(self.ports["postgres"]),
                    "-c",
                    "listen_addresses=127.0.0.1",
                    "-c",
                    "unix_socket_directories=",
                    # A dev database: a crash may lose the last commits, never consistency; saves fsyncs on a
                    # shared disk.
                    "-c",
                    "synchronous_commit=off",
                    "-c",
                    "shared_buffers=32MB",
                ],
                "",
                probe=self._postgres_ready,
                start_timeout_s=60,
                user=_postgres_user(),
            )
        if name == "redis":
            return Service(
                "redis", [_redis_server(), str(self._redis_conf())], "", probe=self._redis_ready, start_timeout_s=30
            )
        raise StackError(f"unknown service {name!r}; expected one of {', '.join(ALL_SERVICES)}")

    # ----- pid bookkeeping -------------------------------------------------------------------------------
    def _pidfile(self, name: str) -> Path:
        return self.run_dir / f"{name}.pid"

    def _saved_ports(self) -> dict[str, int]:
        try:
            return {k: int(v) for k, v in json.loads((self.state / "run" / "ports.json").read_text()).items()}
        except (OSError, ValueError):
            return {}

    def running_pid(self, name: str) -> int | None:
        """The pid recorded for `name` if that very process (same start time) is still alive."""
        try:
            pid_s, started = self._pidfile(name).read_text().split()
            pid = int(pid_s)
        except (OSError, ValueError):
            return None
        return pid if _proc_start_time(pid) == started else None

    def _launch(self, name: str, argv: list[str], env: dict[str, str], user: str | None = None) -> int:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_dir / f"{name}.log", "ab")
        proc = subprocess.Popen(
            argv,
            cwd=self.state,
            env={**os.environ, **env},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            **_as_user(user),
        )
        log.close()
        self._pidfile(name).write_text(f"{proc.pid} {_proc_start_time(proc.pid)}")
        return proc.pid

    # ----- lifecycle --------------------------------------------------------------------------------------
    def up(self, services: tuple[str, ...] = ALL_SERVICES, quiet: bool = False) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "ports.json").write_text(json.dumps(self.ports))
        say = (lambda *_: None) if quiet else (lambda msg: print(msg, flush=True))
        order = [s for s in ALL_SERVICES if s in services]
        running = self._saved_executor().get("executor")
        if "airflow" in order and running and running != self.executor:
            raise StackError(
                f"Airflow is running with the {running} executor; `down` first to switch to {self.executor}"
            )
        if "airflow" in order:  # remembered while Airflow runs, so `status` and a plain `up` see the same mode
            (self.run_dir / "executor.json").write_text(json.dumps({"executor": self.executor, "queues": self.queues}))
            if self.celery:
                order[order.index("airflow") : order.index("airflow")] = list(CELERY_BACKENDS)
        later: list[Service] = []  # launched, health awaited last: MLflow starts while Airflow migrates its DB
        for name in order:
            svc = self._service(name)
            if self.running_pid(name) and svc.healthy():
                say(f"  {name:8s} already running  {self.url(name)}")
                continue
            if name == "airflow":
                self._prepare_airflow(svc.env, say)
            elif name == "postgres":
                self._prepare_postgres(svc.user, say)
            _check_port_free(self.ports[name], name)
            self._launch(name, svc.argv, svc.env, user=svc.user)
            for companion, argv in svc.companions:
                if not self.running_pid(companion):
                    self._launch(companion, argv, {**svc.env, **svc.companion_env.get(companion, {})})
            if name == "mlflow" and "airflow" in order[order.index(name) :]:
                later.append(svc)
                continue
            self._wait_healthy(svc)
            if name == "postgres":
                self._create_airflow_database()
            say(f"  {name:8s} up  (logs: {self.log_dir / (name + '.log')})")
            if name == "s3":
                self._check_buckets()
                fresh = not (self.s3_dir / S3_MARKER).exists()
                (self.s3_dir / S3_MARKER).write_text("S3 data of the posttrain local stack\n")
                if fresh and self._reset_mlflow(say) and "mlflow" not in order:
                    order.append("mlflow")  # it was running on the old S3: bring it back, on the new one
        for svc in later:
            self._wait_healthy(svc)
            say(f"  {svc.name:8s} up  (logs: {self.log_dir / (svc.name + '.log')})")
        self._write_env_file()

    @property
    def mlflow_db(self) -> Path:
        return self.state / "mlflow" / "mlflow.db"

    def _reset_mlflow(self, say) -> bool:
        """Called when S3 starts on a new (or wiped) data folder while an MLflow store exists. S3 keeps its
        objects across restarts, so this is not the normal path: it is a deleted `<state>/s3`, or a state
        folder from before S3 was file-backed. MLflow's store must start over then: its artifacts, and the
        checkpoints its registered model versions (the champion) point at, were in the S3 that is gone, and a
        store that outlived them would send the next pipeline run to a checkpoint that no longer exists. The old
        database is kept beside, renamed. True when MLflow was running (it is stopped)."""
        if not self.mlflow_db.exists():
            return False
        was_running = self.running_pid("mlflow") is not None
        if was_running:
            self.down(only=("mlflow",), quiet=True)
        kept = self.mlflow_db.with_name(f"mlflow.db.before-s3-restart-{time.strftime('%Y%m%d-%H%M%S')}")
        self.mlflow_db.rename(kept)
        say(
            f"  mlflow   S3 started on an empty data folder ({self.s3_dir}), so MLflow starts over too; "
            f"old store kept at {kept}"
        )
        return was_running

    def _prepare_airflow(self, env: dict[str, str], say) -> None:
        self.airflow_home.mkdir(parents=True, exist_ok=True)
        say(f"  airflow  migrating metadata DB ({'PostgreSQL' if self.celery else 'SQLite'}) ...")
        res = subprocess.run(
            [_bin("airflow"), "db", "migrate"],
            env={**os.environ, **env},
            cwd=self.state,
            capture_output=True,
            text=True,
        )
        if res.returncode != 0:
            raise StackError(f"`airflow db migrate` failed:\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")
        # The DAGs put GPU stages in pool "gpu" and sandbox-heavy ones in "sandbox": one slot each here. One
        # `pools import` rather than a `pools set` each: every Airflow command costs seconds of imports.
        pools = self.airflow_home / "pools.json"
        pools.write_text(
            json.dumps(
                {
                    "gpu": {"slots": 1, "description": "GPU stages"},
                    "sandbox": {"slots": 1, "description": "sandbox-heavy stages"},
                }
            )
        )
        subprocess.run(
            [_bin("airflow"), "pools", "import", str(pools)],
            env={**os.environ, **env},
            cwd=self.state,
            capture_output=True,
            text=True,
            check=True,
        )

    # ----- the CeleryExecutor's PostgreSQL and Redis --------------------------------------------------------
    def _prepare_postgres(self, user: str | None, say) -> None:
        """initdb a cluster under `<state>/postgres/data` once (owned by `user`, password auth only)."""
        home = self.state / "postgres"
        data = home / "data"
        if (data / "PG_VERSION").exists():
            return
        say("  postgres initialising a cluster ...")
        home.mkdir(parents=True, exist_ok=True)
        pwfile = home / "initdb-password"
        pwfile.touch(mode=0o600)
        pwfile.write_text(self._secret("postgres") + "\n")
        if user:  # PostgreSQL runs as this user: it must own its folder and read the password
            ids = pwd.getpwnam(user)
            for path in (home, pwfile):
                os.chown(path, ids.pw_uid, ids.pw_gid)
            _check_reachable(home, ids.pw_uid)
        try:
            res = subprocess.run(
                [
                    _pg_bin("initdb"),
                    "-D",
                    str(data),
                    "-U",
                    "airflow",
                    f"--pwfile={pwfile}",
                    "--auth=scram-sha-256",
                    "-E",
                    "UTF8",
                    "--no-locale",
                ],
                capture_output=True,
                text=True,
                cwd=home,
                **_as_user(user),
            )
        finally:
            pwfile.unlink(missing_ok=True)
        if res.returncode != 0:
            shutil.rmtree(data, ignore_errors=True)
            raise StackError(f"initdb failed:\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")

    def _pg_env(self) -> dict[str, str]:
        return {
            **os.environ,
            "PGPASSWORD": self._secret("postgres"),
            "PGHOST": "127.0.0.1",
            "PGPORT": str(self.ports["postgres"]),
            "PGUSER": "airflow",
            "PGCONNECT_TIMEOUT": "5",
        }

    def _postgres_ready(self) -> bool:
        res = subprocess.run([_pg_bin("pg_isready"), "-q", "-d", "postgres"], env=self._pg_env(), capture_output=True)
        return res.returncode == 0

    def _create_airflow_database(self) -> None:
        res = subprocess.run(
            [_pg_bin("psql"), "-d", "postgres", "-tAc", "SELECT 1 FROM pg_database WHERE datname = 'airflow'"],
            env=self._pg_env(),
            capture_output=True,
            text=True,
        )
        if res.returncode == 0 and res.stdout.strip() == "1":
            return
        res = subprocess.run([_pg_bin("createdb"), "airflow"], env=self._pg_env(), capture_output=True, text=True)
        if res.returncode != 0:
            raise StackError(f"createdb airflow failed: {res.stderr.strip()}")

    def _redis_conf(self) -> Path:
        """The broker's config: loopback only, a password, no persistence (Airflow re-queues what it loses)."""
        home = self.state / "redis"
        home.mkdir(parents=True, exist_ok=True)
        conf = home / "redis.conf"
        conf.touch(mode=0o600)
        conf.write_text(
            "\n".join(
                [
                    "bind 127.0.0.1",
                    f"port {self.ports['redis']}",
                    f"requirepass {self._secret('redis')}",
                    f'dir "{home}"',
                    'save ""',
                    "appendonly no",
                    "daemonize no",
                    "protected-mode yes",
                    "",
                ]
            )
        )
        return conf

    def _redis_ready(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.ports["redis"]), timeout=2) as conn:
                conn.sendall(b"PING\r\n")
                answer = conn.recv(64)
        except OSError:
            return False
        return answer.startswith((b"+PONG", b"-NOAUTH"))  # up, and (rightly) asking for the password

    def _wait_healthy(self, svc: Service) -> None:
        deadline = time.monotonic() + svc.start_timeout_s
        while time.monotonic() < deadline:
            if svc.healthy():
                return
            if not self.running_pid(svc.name):
                break
            time.sleep(0.5)
        tail = _tail(self.log_dir / f"{svc.name}.log")
        self.down(only=(svc.name,), quiet=True)
        raise StackError(f"{svc.name} did not become healthy at {svc.health_url}; last log lines:\n{tail}")

    def _check_buckets(self, answer_within_s: float = 60.0) -> None:
        """The S3 server creates its buckets before it listens; this only confirms it (an S3 server upgrade that moved
        its backends would show here, at `up`, rather than as NoSuchBucket in some stage). It creates nothing."""
        missing, unanswered = [], []
        # A loaded machine can keep a just-started server from answering the first requests for a while (a demo
        # once hit a 10-second limit here on 2 busy cores): each bucket gets `answer_within_s` of retries before
        # `up` fails, and that failure names the bucket and shows the server's log rather than a socket traceback.
        for bucket in BUCKETS:
            req = urllib.request.Request(f"{self.s3_url}/{bucket}", method="HEAD")
            deadline = time.monotonic() + answer_within_s
            while True:
                try:
                    wait = min(10.0, max(0.5, deadline - time.monotonic()))
                    urllib.request.urlopen(req, timeout=wait).close()
                    break
                except urllib.error.HTTPError as err:
                    if err.code != 404:
                        raise
                    missing.append(bucket)
                    break
                except OSError:
                    if time.monotonic() >= deadline:
                        unanswered.append(bucket)
                        break
                    time.sleep(1)
        if missing or unanswered:
            tail = _tail(self.log_dir / "s3.log")
            self.down(only=("s3",), quiet=True)
            problem = (
                f"s3 came up without bucket(s) {', '.join(missing)}"
                if missing
                else f"s3 did not answer for bucket(s) {', '.join(unanswered)} within {answer_within_s:g} s"
            )
            raise StackError(f"{problem}; last log lines:\n{tail}")

    def _write_env_file(self) -> None:
        lines = [f"export {k}={v}" for k, v in self.client_env().items()]
        (self.state / "env").write_text("\n".join(lines) + "\n")

    def workers(self) -> list[str]:
        """The Celery workers this state folder has pid files for (whatever mode asked `down`)."""
        return sorted(p.stem for p in self.run_dir.glob(f"{WORKER_PREFIX}*.pid"))

    def down(self, only: tuple[str, ...] | None = None, quiet: bool = False) -> None:
        names = []
        for name in only or ALL_SERVICES:
            names.append(name)
            if name == "airflow":
                # The CeleryExecutor's workers, then its database and broker, after the rest of Airflow.
                names += ["airflow-scheduler", "airflow-dag-processor", *self.workers(), *CELERY_BACKENDS]
        # All at once, the groups' grace periods running side by side rather than one after the other (on a loaded
        # machine MLflow's server alone used the whole 15 s); the database and broker once every Airflow process
        # is gone.
        for phase in ([n for n in names if n not in CELERY_BACKENDS], [n for n in names if n in CELERY_BACKENDS]):
            running = {name: pid for name in phase if (pid := self.running_pid(name))}
            # SIGINT is PostgreSQL's fast shutdown (SIGTERM would wait for every client to leave).
            _stop_groups(
                [(pid, signal.SIGINT if name == "postgres" else signal.SIGTERM) for name, pid in running.items()]
            )
            for name in phase:
                if name in running and not quiet:
                    print(f"  {name:22s} stopped (pid {running[name]})", flush=True)
                self._pidfile(name).unlink(missing_ok=True)

    def status(self) -> dict[str, dict]:
        out = {}
        for name in ALL_SERVICES + (CELERY_BACKENDS if self.celery else ()):
            svc = self._service(name)
            out[name] = {"pid": self.running_pid(name), "healthy": svc.healthy(), "url": self.url(name)}
        for worker in self.workers() if self.celery else []:
            pid = self.running_pid(worker)
            out[worker] = {"pid": pid, "healthy": pid is not None, "queue": worker[len(WORKER_PREFIX) :]}
        return out

    def _saved_executor(self) -> dict:
        """The executor and queues the running Airflow was started with (nothing once it is down)."""
        try:
            saved = json.loads((self.run_dir / "executor.json").read_text())
        except (OSError, ValueError):
            return {}
        return saved if self.running_pid("airflow") else {}


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status < 500
    except urllib.error.HTTPError as err:
        return err.code < 500
    except (OSError, ValueError):
        return False


def _pg_bin(name: str) -> str:
    """A PostgreSQL program: Debian keeps them under /usr/lib/postgresql/<version>/bin (newest wins), off PATH."""
    found = sorted(
        Path("/usr/lib/postgresql").glob(f"*/bin/{name}"),
        key=lambda p: int(p.parts[-3]) if p.parts[-3].isdigit() else 0,
    )
    if found:
        return str(found[-1])
    on_path = shutil.which(name)
    if on_path is None:
        raise StackError(f"PostgreSQL's {name} not found (the celery executor needs it): apt-get install postgresql")
    return on_path


def _redis_server() -> str:
    found = shutil.which("redis-server")
    if found is None:
        raise StackError("redis-server not found (the celery executor needs it): apt-get install redis-server")
    return found


def _postgres_user() -> str | None:
    """Who runs PostgreSQL: the `postgres` user when we are root (it refuses root), else ourselves."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        raise StackError(
            "running as root, and PostgreSQL refuses root: no `postgres` user to run it as "
            "(Debian's postgresql package creates one)"
        ) from None
    return "postgres"


def _as_user(user: str | None) -> dict:
    """subprocess keyword arguments that run a child as `user` (only its own groups), or nothing."""
    if not user:
        return {}
    ids = pwd.getpwnam(user)
    return {"user": ids.pw_uid, "group": ids.pw_gid, "extra_groups": []}


def _check_reachable(path: Path, uid: int) -> None:
    """The `postgres` user must be able to walk down to its data folder; a private parent (0700, e.g. a pytest
    temporary folder) stops it, with an error that does not say where."""
    for parent in path.resolve().parents:
        st = parent.stat()
        if st.st_uid != uid and not st.st_mode & 0o001:
            raise StackError(
                f"PostgreSQL runs as uid {uid}, which cannot enter {parent} (mode "
                f"{st.st_mode & 0o777:o}); use a state folder whose parents others may enter"
            )


def _check_port_free(port: int, name: str) -> None:
    with socket.socket() as s:
        if s.connect_ex(("127.0.0.1", port)) == 0:
            raise StackError(
                f"port {port} for {name} is taken by a process this stack did not start; "
                f"stop it or choose another port (--port-{name})"
            )


def _stop_groups(targets: list[tuple[int, signal.Signals]], grace_s: float = 15.0) -> None:
    """Signal the process group of each (leader pid, signal), wait up to `grace_s` for all of them to be gone,
    then SIGKILL what is left."""
    groups: dict[int, int] = {}  # pgid -> leader pid
    for pid, sig in targets:
        try:
            pgid = os.getpgid(pid)
            os.killpg(pgid, sig)
        except ProcessLookupError:
            continue
        groups[pgid] = pid
    deadline = time.monotonic() + grace_s
    while groups and time.monotonic() < deadline:
        for pgid, pid in list(groups.items()):
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                del groups[pgid]
                continue
            # Reap if it happens to be our child (tests start the stack in-process).
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
        time.sleep(0.2)
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _tail(path: Path, n: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stack", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["up", "down", "status", "env"])
    parser.add_argument("--state-dir", type=Path, default=DEFAULT_STATE, help="default: %(default)s")
    parser.add_argument("--services", default=",".join(ALL_SERVICES), help="comma list (default: all)")
    parser.add_argument(
        "--host",
        default=DEFAULT_HOST,
        help="address every service listens on (default: %(default)s; 0.0.0.0 exposes the stack)",
    )
    parser.add_argument(
        "--executor",
        choices=EXECUTORS,
        default=None,
        help="Airflow executor (default: $POSTTRAIN_EXECUTOR, else the running stack's, else local)",
    )
    parser.add_argument(
        "--queues",
        default=None,
        help="celery: one worker per queue, comma list (default: gpu,cpu,sandbox as named by "
        "POSTTRAIN_QUEUE_GPU/_CPU/_SANDBOX)",
    )
    for name, port in DEFAULT_PORTS.items():
        parser.add_argument(f"--port-{name}", type=int, default=None, help=f"default {port}")
    args = parser.parse_args(argv)
    ports = {n: getattr(args, f"port_{n}") for n in DEFAULT_PORTS if getattr(args, f"port_{n}")}
    queues = tuple(q.strip() for q in args.queues.split(",") if q.strip()) if args.queues else None
    services = tuple(s.strip() for s in args.services.split(",") if s.strip())
    try:
        stack = Stack(args.state_dir, ports, host=args.host, executor=args.executor, queues=queues)
        if args.command == "up":
            stack.up(services)
            print(f"\n  MLflow UI : {stack.mlflow_url}")
            if "airflow" in services:
                print(f"  Airflow UI: {stack.airflow_url}  (user {AIRFLOW_USER}, password {stack.airflow_password()})")
                if stack.celery:
                    print(
                        f"  Executor  : CeleryExecutor, one worker per queue: {', '.join(stack.queues)} "
                        f"(broker {stack.url('redis')}, database {stack.url('postgres')})"
                    )
            print(f"  S3 server : {stack.s3_url}  (bucket s3://posttrain)")
            print(f"  Shell env : source {stack.state / 'env'}")
        elif args.command == "down":
            stack.down(services)
        elif args.command == "status":
            print(json.dumps(stack.status(), indent=2))
        else:
            print("\n".join(f"export {k}={v}" for k, v in stack.client_env().items()))
    except StackError as err:
        print(f"stack: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
