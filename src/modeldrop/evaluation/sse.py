"""Server-sent events from arbitrary byte chunks (PayloadPart boundaries fall anywhere).

SageMaker's response stream cuts the container's SSE bytes at arbitrary points: one event may
span many PayloadParts, one part may hold several events, and a multi-byte UTF-8 character may
be split between parts. Buffer the bytes, split on the blank line, decode incrementally.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# An event ends at a blank line; the spec allows CRLF, LF or CR line endings.
_EVENT_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")


@dataclass(frozen=True)
class SSEEvent:
    data: str
    event: str = "message"

    @property
    def is_done(self) -> bool:
        return self.data.strip() == "[DONE]"


class SSEDecoder:
    """Feed bytes, get complete events; `close()` returns an unterminated trailing event."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        self._buffer += chunk
        events: list[SSEEvent] = []
        while True:
            match = _EVENT_END.search(self._buffer)
            if match is None:
                # A lone CR at the end may be the first half of CRLF: keep waiting.
                return events
            raw, self._buffer = self._buffer[: match.start()], self._buffer[match.end() :]
            event = _parse_event(raw)
            if event is not None:
                events.append(event)

    def close(self) -> list[SSEEvent]:
        raw, self._buffer = self._buffer, b""
        event = _parse_event(raw.rstrip(b"\r\n")) if raw.strip() else None
        return [event] if event is not None else []


def _parse_event(raw: bytes) -> SSEEvent | None:
    # Bytes are decoded per complete event, never per chunk: a character split between two
    # PayloadParts is whole again here.
    text = raw.decode("utf-8", errors="replace")
    data: list[str] = []
    name = "message"
    for line in re.split(r"\r\n|\n|\r", text):
        if not line or line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "data":
            data.append(value)
        elif field == "event":
            name = value
    if not data:
        return None
    return SSEEvent(data="\n".join(data), event=name)
