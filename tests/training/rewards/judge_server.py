"""A real local HTTP server speaking the OpenAI chat-completions wire format, for judge tests.

It grades like a (very strict) judge would, deterministically: "Score: 9" when the answer to grade contains
the reference answer's last line, "Score: 2" otherwise; "I cannot grade this." (no score) when the answer
contains NOSCORE; a 5 s stall when it contains SLOW. Every request is recorded.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class JudgeServer:
    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # keep test output quiet
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                owner.requests.append({"path": self.path, "body": body, "auth": self.headers.get("Authorization")})
                if self.path != "/v1/chat/completions":
                    self.send_error(404)
                    return
                content = body["messages"][-1]["content"]
                reference = content.split("Reference answer (may be empty):\n", 1)[-1]
                reference = reference.split("\n\nAnswer to grade", 1)[0]
                graded = content.split("Answer to grade:\n", 1)[-1].split("\n\nRate the answer", 1)[0]
                if "SLOW" in graded:
                    time.sleep(5)
                want = reference.strip().splitlines()[-1].strip() if reference.strip() else ""
                reply = (
                    "I cannot grade this."
                    if "NOSCORE" in graded
                    else "Score: 9"
                    if want and want in graded
                    else "Score: 2"
                )
                data = json.dumps(
                    {
                        "id": "chatcmpl-1",
                        "object": "chat.completion",
                        "model": body.get("model"),
                        "choices": [
                            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": reply}}
                        ],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                    }
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self) -> JudgeServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
