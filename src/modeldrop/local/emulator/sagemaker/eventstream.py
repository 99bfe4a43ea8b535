"""AWS event-stream framing (application/vnd.amazon.eventstream), the encoding side.

The local sagemaker-runtime endpoint frames the container's bytes exactly as SageMaker does for
InvokeEndpointWithResponseStream, so botocore's own decoder is what the eval reads through.
"""

from __future__ import annotations

import json
import struct
import zlib

_STRING = 7


def _headers(headers: dict[str, str]) -> bytes:
    out = b""
    for name, value in headers.items():
        key = name.encode()
        val = value.encode()
        out += struct.pack("!B", len(key)) + key + struct.pack("!BH", _STRING, len(val)) + val
    return out


def encode_message(headers: dict[str, str], payload: bytes) -> bytes:
    head = _headers(headers)
    total = 12 + len(head) + len(payload) + 4
    prelude = struct.pack("!II", total, len(head))
    prelude += struct.pack("!I", zlib.crc32(prelude))
    body = prelude + head + payload
    return body + struct.pack("!I", zlib.crc32(body))


def payload_part(data: bytes) -> bytes:
    return encode_message(
        {":event-type": "PayloadPart", ":content-type": "application/octet-stream", ":message-type": "event"}, data
    )


def stream_error(kind: str, message: str, error_code: str | None = None) -> bytes:
    """A modeled exception event: ModelStreamError or InternalStreamFailure."""
    body: dict[str, str] = {"Message": message}
    if error_code:
        body["ErrorCode"] = error_code
    return encode_message(
        {":exception-type": kind, ":content-type": "application/json", ":message-type": "exception"},
        json.dumps(body).encode(),
    )
