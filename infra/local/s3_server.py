"""moto's S3 server, started with its buckets already in place.

    python infra/local/s3_server.py --host 127.0.0.1 --port 9000 --bucket posttrain --bucket mlflow

`moto_server` answers as soon as it listens, with no buckets; creating them afterwards over HTTP leaves a window
in which a client (one retrying through the start-up, say) gets NoSuchBucket. Here the buckets are created in
moto's in-process S3 backend first, and only then does the server bind its port, so nothing can ever reach the
server before the buckets exist. The server is the same one `moto_server` runs (moto's WSGI app and request
handler on werkzeug), serving the same in-memory backend: everything is still lost when the process ends.

Standard library and moto (with its server extra) only: the stack runs this with the project venv's python.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from types import FrameType

DEFAULT_REGION = "us-east-1"


def _exit(signum: int, frame: FrameType | None) -> None:
    # As `moto_server` does: SIGTERM (what `stack down` sends) unwinds serve_forever and closes the socket.
    sys.exit(0)


def create_buckets(buckets: list[str], region: str = DEFAULT_REGION) -> None:
    """Create `buckets` in the in-process S3 backend that the server will serve (idempotent)."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends
    from moto.utilities.utils import get_partition

    # The backend a request lands on is s3_backends[account][partition]: the account is MOTO_ACCOUNT_ID when
    # set, else (for access keys moto's IAM does not know, like the stack's dev keys) the default account.
    account = os.environ.get("MOTO_ACCOUNT_ID", DEFAULT_ACCOUNT_ID)
    backend = s3_backends[account][get_partition(region)]
    for name in buckets:
        if name not in backend.buckets:
            backend.create_bucket(name, region)
        backend.head_bucket(name)  # raises MissingBucket if moto ever stores buckets elsewhere


def serve(host: str, port: int, buckets: list[str], region: str = DEFAULT_REGION) -> None:
    """Create the buckets, then bind `host:port` and serve S3 until terminated."""
    # moto reads MOTO_PORT for URLs it hands out; `moto_server` sets it the same way.
    os.environ.setdefault("MOTO_PORT", str(port))
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import make_server

    create_buckets(buckets, region)
    app = DomainDispatcherApplication(create_backend_app)
    # make_server binds and listens right here, after the buckets exist: that ordering is the point of this file.
    server = make_server(host, port, app, threaded=True, request_handler=MotoRequestHandler)
    print(f"s3_server: serving buckets {', '.join(buckets) or '(none)'} on http://{host}:{port}", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="s3_server", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--bucket", action="append", default=[], help="create this bucket first (repeatable)")
    parser.add_argument("--region", default=DEFAULT_REGION, help="region of the buckets (default: %(default)s)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _exit)
    signal.signal(signal.SIGINT, _exit)
    serve(args.host, args.port, args.bucket, args.region)
    return 0


if __name__ == "__main__":
    sys.exit(main())
