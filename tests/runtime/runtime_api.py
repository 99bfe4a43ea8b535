"""The Lambda Runtime API (2018-06-01) for one function's container: what the Lambda service serves to
a container image's runtime interface client (awslambdaric) on AWS_LAMBDA_RUNTIME_API.

`invoke(event)` hands EVENT to the next `GET /runtime/invocation/next` the client makes and returns
what it posts back: the handler's result, or the runtime's error shape. One invocation at a time, as a
Lambda sandbox takes them; an init error (a broken image) answers every invocation.
"""

from __future__ import annotations

import json
import queue
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

PREFIX = "/2018-06-01/runtime"


class RuntimeApi:
    def __init__(self, function_arn: str, timeout_s: float) -> None:
        self.function_arn, self.timeout_s = function_arn, timeout_s
        self.events: queue.Queue[tuple[str, bytes]] = queue.Queue()
        self.answers: dict[str, queue.Queue[tuple[bool, Any]]] = {}
        self.init_error: Any = None
        self.served = 0
        self.lock = threading.Lock()
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_args: object) -> None:
                pass

            def _reply(self, status: int, body: bytes = b"{}", headers: dict[str, str] | None = None) -> None:
                self.send_response(status)
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                if self.path != f"{PREFIX}/invocation/next":
                    self._reply(404)
                    return
                request_id, body = api.events.get()
                deadline = int((time.time() + api.timeout_s) * 1000)
                self._reply(200, body, {
                    "Lambda-Runtime-Aws-Request-Id": request_id,
                    "Lambda-Runtime-Deadline-Ms": str(deadline),
                    "Lambda-Runtime-Invoked-Function-Arn": api.function_arn,
                    "Lambda-Runtime-Trace-Id": f"Root=1-{int(time.time()):08x}-{uuid.uuid4().hex[:24]};Sampled=1",
                })  # fmt: skip

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"null")
                parts = self.path[len(PREFIX) :].strip("/").split("/")
                if parts == ["init", "error"]:
                    api.init_error = body
                    with api.lock:
                        for answers in api.answers.values():
                            answers.put((True, body))
                elif len(parts) == 3 and parts[0] == "invocation" and parts[1] in api.answers:
                    api.answers[parts[1]].put((parts[2] == "error", body))
                else:
                    self._reply(404)
                    return
                self._reply(202, b'{"status":"OK"}')

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def address(self) -> str:
        host, port = self.server.server_address[:2]
        return f"{host}:{port}"

    def invoke(self, event: Any, wait_s: float) -> tuple[bool, Any]:
        """(is_error, payload) for EVENT, as the client answered it within WAIT_S."""
        if self.init_error is not None:
            return True, self.init_error
        request_id = str(uuid.uuid4())
        answers: queue.Queue[tuple[bool, Any]] = queue.Queue()
        with self.lock:
            self.answers[request_id] = answers
        self.events.put((request_id, json.dumps(event).encode()))
        try:
            answer = answers.get(timeout=wait_s)
        except queue.Empty:
            return True, {"errorType": "Sandbox.Timedout", "errorMessage": f"no answer within {wait_s:.0f} s"}
        self.served += 1
        return answer

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
