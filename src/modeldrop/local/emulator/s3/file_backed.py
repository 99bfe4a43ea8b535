"""File-backed object bodies for the emulator's S3, so a multi-GB artifact never sits in memory.

moto keeps an object in a spooled temp file but hands it around whole: completing a multipart
upload joins every part in a bytearray, `FakeKey.value` reads the file into bytes (CopyObject and
GetObject both use it), and the in-process transport wraps a response body in a BytesIO. A 2 GB
run-local peaked at 5.7 GB. Here, above LARGE bytes:

- a multipart upload is completed into a temp file, part by part;
- a key's value is written in chunks (the spool rolls over to disk at once) and read back as a
  read-only mmap of its file (slices, len, hashing and the buffer protocol work; nothing is copied);
- a GetObject response streams from that mmap, and each chunk read (or copied) is dropped from
  the process's resident set behind the reader (MADV_DONTNEED): the page cache keeps it, not RSS.

Smaller objects (records, reports, the marker) keep moto's own behaviour.
"""

from __future__ import annotations

import gc
import mmap
import tempfile
import threading
from collections.abc import Iterator
from functools import cache
from typing import IO, Any

LARGE = 32 * 1024 * 1024
CHUNK = 8 * 1024 * 1024  # a multiple of the page size: the unit of copying and of dropping pages
COLLECT_EVERY = 16 * 1024 * 1024  # of uploaded parts: each leaves about four dead copies of itself


def _drop(view: mmap.mmap, start: int, length: int) -> None:
    """Give back the pages of [start, start + length) that this process touched (clean file pages)."""
    start -= start % mmap.PAGESIZE
    length = min(length + CHUNK, len(view) - start)
    if length > 0:
        view.madvise(mmap.MADV_DONTNEED, start, length)


class MappedBody:
    """A GetObject body read from an mmap in chunks, each dropped from RSS once returned."""

    def __init__(self, view: mmap.mmap) -> None:
        self.view, self.position = view, 0

    def read(self, amt: int | None = None) -> bytes:
        end = len(self.view) if amt is None or amt < 0 else min(len(self.view), self.position + amt)
        data = self.view[self.position : end]
        if end - self.position >= mmap.PAGESIZE:
            _drop(self.view, self.position, end - self.position)
        self.position = end
        return data

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(memoryview(buffer)))
        memoryview(buffer)[: len(data)] = data
        return len(data)

    def readable(self) -> bool:
        return True

    def stream(self, **_kwargs: Any) -> Iterator[bytes]:
        while chunk := self.read(CHUNK):
            yield chunk

    def close(self) -> None:
        self.view.close()


def _mapped(key: Any) -> mmap.mmap | None:
    """The key's spooled file as a read-only mmap, once it has rolled over to disk."""
    buffer = key._value_buffer
    if key.contentsize < LARGE or not getattr(buffer, "_rolled", False):
        return None
    buffer.flush()
    return mmap.mmap(buffer.fileno(), 0, access=mmap.ACCESS_READ)


def _write(buffer: IO[bytes], value: Any) -> int:
    """Write VALUE (bytes, an mmap or a readable file) in chunks; return its size."""
    if hasattr(value, "read") and not isinstance(value, mmap.mmap):
        size = 0
        while chunk := value.read(CHUNK):
            buffer.write(chunk)
            size += len(chunk)
        return size
    view = memoryview(value)
    for start in range(0, len(view), CHUNK):
        buffer.write(view[start : start + CHUNK])
        if isinstance(value, mmap.mmap):
            _drop(value, start, CHUNK)
    return len(view)


class SharedBuffer:
    """A large key's file, shared by the copies moto makes of the key (ListObjectVersions deep-copies
    every version): a copy reads the same file, and closing a copy leaves it open."""

    def __init__(self, buffer: Any) -> None:
        self.buffer: Any = buffer.buffer if isinstance(buffer, SharedBuffer) else buffer

    def __deepcopy__(self, memo: dict[int, Any]) -> SharedBuffer:
        return self

    def close(self) -> None:
        pass  # the original key's own buffer closes it

    def __getattr__(self, name: str) -> Any:
        return getattr(self.buffer, name)


@cache
def bound_allocator() -> None:
    """Make glibc give freed multi-MB buffers back to the OS.

    By default each thread gets its own malloc arena and glibc raises its mmap threshold after
    large frees, so multi-MB buffers pile up on heaps that are never trimmed. One arena, trimming,
    a fixed threshold.
    """
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc: nothing to tune
        return
    m_trim_threshold, m_mmap_threshold, m_arena_max = -1, -3, -8
    libc.mallopt(m_arena_max, 1)
    libc.mallopt(m_trim_threshold, 0)
    libc.mallopt(m_mmap_threshold, 1024 * 1024)


def install() -> None:
    from moto.core import botocore_stubber
    from moto.s3 import models

    # Request bodies are 8 MB each: with glibc's sliding mmap threshold they land on the heap and
    # stay there after they are freed; a fixed threshold gives them back.
    bound_allocator()

    plain_getter = models.FakeKey.value.fget  # type: ignore[attr-defined]

    def get_value(self: Any) -> Any:
        with self.lock:
            view = _mapped(self)
        return view if view is not None else plain_getter(self)

    def set_value(self: Any, new_value: Any) -> None:
        self._value_buffer.seek(0)
        self._value_buffer.truncate()
        if isinstance(new_value, str):
            new_value = new_value.encode("utf-8")
        self.contentsize = _write(self._value_buffer, new_value)

    models.FakeKey.value = property(get_value, set_value)  # type: ignore[assignment]

    plain_getstate, plain_setstate = models.FakeKey.__getstate__, models.FakeKey.__setstate__

    def getstate(self: Any) -> dict[str, Any]:
        if self.contentsize < LARGE:
            return plain_getstate(self)
        state = self.__dict__.copy()  # not the value: 2 GB per copy, for a listing
        state["_value_buffer"] = SharedBuffer(self._value_buffer)
        del state["lock"]
        return state

    def setstate(self: Any, state: dict[str, Any]) -> None:
        if not isinstance(state.get("_value_buffer"), SharedBuffer):
            plain_setstate(self, state)
            return
        self.__dict__.update(state)
        self.lock = threading.Lock()

    models.FakeKey.__getstate__ = getstate  # type: ignore[method-assign]
    models.FakeKey.__setstate__ = setstate  # type: ignore[method-assign]

    def complete(self: Any, body: Iterator[tuple[int, str]]) -> tuple[Any, str, Any]:
        """FakeMultipart.complete, joining the parts into a temp file instead of a bytearray."""
        builder = models.MultipartChecksumBuilder(
            self.metadata.get("x-amz-checksum-algorithm"), self.metadata.get("x-amz-checksum-type")
        )
        joined = tempfile.TemporaryFile()  # noqa: SIM115 - handed to put_object, closed with the run
        md5s = bytearray()
        last = None
        count = 0
        for number, etag in body:
            part = self.parts.get(number)
            if part is None or part.etag.replace('"', "") != etag.replace('"', ""):
                raise models.InvalidPart()
            if last is not None and last.contentsize < models.S3_UPLOAD_PART_MIN_SIZE:
                raise models.EntityTooSmall()
            md5s.extend(bytes.fromhex(part.etag.replace('"', "")))
            value = part.value
            joined.write(value)
            builder.addPart(value)
            last = part
            count += 1
        if count == 0:
            raise models.MalformedXML
        joined.seek(0)
        full = models.md5_hash()
        full.update(bytes(md5s))
        return joined, f"{full.hexdigest()}-{count}", builder.build()

    models.FakeMultipart.complete = complete  # type: ignore[method-assign]

    plain_upload_part = models.S3Backend.upload_part
    uploaded = [0]

    def upload_part(self: Any, bucket_name: str, multipart_id: str, part_id: int, value: bytes) -> Any:
        # Each part's request and its parsed copy sit in reference cycles (werkzeug's request and
        # moto's response objects) until the cycle collector runs: left alone, a 2 GB upload held
        # gigabytes of dead part bodies. Collect every COLLECT_EVERY bytes of parts.
        key = plain_upload_part(self, bucket_name, multipart_id, part_id, value)
        uploaded[0] += len(value)
        if uploaded[0] >= COLLECT_EVERY:
            uploaded[0] = 0
            if not gc.get_freeze_count():
                # The emulator's own long-lived objects (moto's backends, botocore's models) out of
                # every later collection, which then walks only what the upload made: ms, not 0.3 s.
                gc.collect()
                gc.freeze()
            gc.collect()
        return key

    models.S3Backend.upload_part = upload_part  # type: ignore[method-assign]

    plain_response = botocore_stubber.MockRawResponse

    def raw_response(body: Any) -> Any:
        return MappedBody(body) if isinstance(body, mmap.mmap) else plain_response(body)

    botocore_stubber.MockRawResponse = raw_response  # type: ignore[misc, assignment]
