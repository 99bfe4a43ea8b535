"""What the local HTTP servers share (standard library only: the engines run it in their own process)."""

from __future__ import annotations

import json
import socket
from http.server import BaseHTTPRequestHandler
from typing import Any


class StreamingJSONHandler(BaseHTTPRequestHandler):
    """HTTP/1.1 with JSON replies and chunked streams written as they are produced."""

    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        # Streamed parts are small writes: without NODELAY, Nagle + delayed ACK hold each for ~40 ms.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def send_json(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        raw = json.dumps(body).encode()
        self.send_response(status)
        for name, value in {"Content-Type": "application/json", **(headers or {})}.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def start_chunked(self, headers: dict[str, str]) -> None:
        self.send_response(200)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def write_chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def end_chunked(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
