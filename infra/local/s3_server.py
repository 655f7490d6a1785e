"""The embedded stack's S3-compatible server: s3rver (npm), file-backed, started with its buckets in place.

    python infra/local/s3_server.py --host 127.0.0.1 --port 9000 --data-dir .local/s3 --bucket posttrain --bucket mlflow

Why s3rver: every object is a plain file under `--data-dir`, written before the server answers the PUT, so what
S3 held survives `make down` / `make up`, a killed server and a reboot. It is installed from the npm registry
into `infra/local/s3rver/node_modules` (pinned by the lockfile beside it; `make install` and `.ci/run` run
`npm ci` there) and needs only `node`. Its `run()` creates the `--configure-bucket` buckets and only then
binds the port, so no client (one retrying through the start-up, say) can ever reach it before its buckets
exist. It knows one account, access key `S3RVER` / secret `S3RVER` (its fixed dev credentials).

The stack (and `stack.py`'s argv) runs this file, which replaces itself with node (same pid, so the stack's
pid file and process group stay right). Standard library only.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PACKAGE_DIR = HERE / "s3rver"
ENTRY = PACKAGE_DIR / "node_modules" / "s3rver" / "bin" / "s3rver.js"
ACCESS_KEY = "S3RVER"
SECRET_KEY = "S3RVER"


class S3ServerMissing(RuntimeError):
    pass


def node_argv(host: str, port: int, data_dir: Path, buckets: list[str]) -> list[str]:
    """The command that serves `data_dir` as S3 on host:port, creating `buckets` before it listens."""
    node = shutil.which("node")
    if node is None:
        raise S3ServerMissing("`node` is not on PATH: install Node.js (apt-get install nodejs npm)")
    if not ENTRY.exists():
        raise S3ServerMissing(
            f"s3rver is not installed at {ENTRY}: run `npm ci --prefix {PACKAGE_DIR}` (make install does)"
        )
    argv = [
        node,
        str(ENTRY),
        "--directory",
        str(data_dir),
        "--address",
        host,
        "--port",
        str(port),
        # Path-style only: clients reach it by IP address, never as <bucket>.<host>.
        "--no-vhost-buckets",
        "--silent",
    ]
    for name in buckets:
        argv += ["--configure-bucket", name]
    return argv


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="s3_server", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--data-dir", type=Path, required=True, help="where objects live (created if missing)")
    parser.add_argument("--bucket", action="append", default=[], help="create this bucket first (repeatable)")
    args = parser.parse_args(argv)
    args.data_dir.mkdir(parents=True, exist_ok=True)
    try:
        cmd = node_argv(args.host, args.port, args.data_dir.resolve(), args.bucket)
    except S3ServerMissing as err:
        print(f"s3_server: {err}", file=sys.stderr)
        return 1
    print(
        f"s3_server: serving {args.data_dir} (buckets {', '.join(args.bucket) or 'none'}) "
        f"on http://{args.host}:{args.port}",
        flush=True,
    )
    os.execv(cmd[0], cmd)
    return 0  # not reached: execv replaced this process


if __name__ == "__main__":
    sys.exit(main())
