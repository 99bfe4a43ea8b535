"""The SSE reader under arbitrary PayloadPart boundaries, and event-stream framing read by botocore."""

from __future__ import annotations

import itertools
import json

from botocore.eventstream import EventStreamBuffer
from hypothesis import given, settings
from hypothesis import strategies as st

from modeldrop.evaluation.sse import SSEDecoder, SSEEvent
from modeldrop.local.emulator.sagemaker import eventstream

# Text with multi-byte characters (2, 3 and 4 bytes in UTF-8), but no line breaks inside a data line.
TEXT = st.text(alphabet=st.sampled_from(list('ab {}":,é모델😀\\[]')), max_size=40)


def _wire(datas: list[str], newline: str) -> bytes:
    return "".join(f"data: {d}{newline}{newline}" for d in datas).encode()


def _split(blob: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(blob) + 1) for c in cuts})
    edges = [0, *points, len(blob)]
    return [blob[a:b] for a, b in itertools.pairwise(edges)]


@settings(max_examples=300, deadline=None)
@given(
    datas=st.lists(TEXT, min_size=1, max_size=8),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=30),
    newline=st.sampled_from(["\n", "\r\n"]),
)
def test_events_survive_any_split(datas: list[str], cuts: list[int], newline: str) -> None:
    blob = _wire([*datas, "[DONE]"], newline)
    decoder = SSEDecoder()
    events: list[SSEEvent] = []
    for part in _split(blob, cuts):
        events += decoder.feed(part)
    events += decoder.close()
    assert [e.data for e in events] == [*datas, "[DONE]"]
    assert events[-1].is_done


@settings(max_examples=100, deadline=None)
@given(data=TEXT, size=st.integers(min_value=1, max_value=5))
def test_byte_by_byte_and_small_parts(data: str, size: int) -> None:
    blob = _wire([data, data], "\n")
    decoder = SSEDecoder()
    got = []
    for i in range(0, len(blob), size):
        got += decoder.feed(blob[i : i + size])
    assert [e.data for e in got] == [data, data]


def test_several_events_in_one_part_comments_multiline_and_names() -> None:
    decoder = SSEDecoder()
    events = decoder.feed(b': keep-alive\n\nevent: error\ndata: {"a":\ndata: 1}\n\ndata:x\n\ndata: tail')
    assert [(e.event, e.data) for e in events] == [("error", '{"a":\n1}'), ("message", "x")]
    assert [e.data for e in decoder.close()] == ["tail"]


def _decode(blob: bytes) -> list[dict[str, object]]:
    buffer = EventStreamBuffer()
    buffer.add_data(blob)
    return [{"headers": m.headers, "payload": m.payload} for m in buffer]


@given(payload=st.binary(max_size=300))
def test_payload_parts_decode_with_botocore(payload: bytes) -> None:
    [message] = _decode(eventstream.payload_part(payload))
    assert message["payload"] == payload
    assert message["headers"] == {
        ":event-type": "PayloadPart",
        ":content-type": "application/octet-stream",
        ":message-type": "event",
    }


def test_stream_error_is_a_modeled_exception_event() -> None:
    [message] = _decode(eventstream.stream_error("ModelStreamError", "boom", "StreamBroken"))
    headers = message["headers"]
    assert isinstance(headers, dict)
    assert headers[":message-type"] == "exception" and headers[":exception-type"] == "ModelStreamError"
    assert json.loads(message["payload"]) == {"Message": "boom", "ErrorCode": "StreamBroken"}  # type: ignore[arg-type]
