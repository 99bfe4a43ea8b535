"""A local .tar.gz inflated in parallel by rapidgzip's own command, read forward from a pipe.

Why a child process and not `rapidgzip.RapidgzipFile` in this one: the Python class always keeps
a seek index (a compressed 32 KiB window per chunk, plus the chunks it caches for seeking back),
which costs time and memory that grow with the data; measured on 1 GB (2 cores) it peaked at
75-160 MB. Its command turns the index off when it only has to write the stream out
(`setKeepIndex(false)`, which Python cannot reach), and so peaks at ~50-90 MB whatever the size.
Validation reads only tar headers and the start of each member: the rest is moved from the pipe
to /dev/null by the kernel (splice), never copied into this process.

The decoder's memory grows with the compression ratio, and the gzip trailer that gates this path
can lie: a 1 MB zero bomb whose trailer claims 1.2 MB took the command to 432 MB. A watchdog
reads the child's resident size from /proc every few milliseconds and kills it past
MAX_CHILD_RSS; the file then goes to the sequential inflater, whose memory is flat.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import os
import subprocess
import sys
import threading
from pathlib import Path
from types import TracebackType

# rapidgzip's default; 2 MiB chunks were slower and, on one of the bench kinds, larger.
CHUNK_KIB = 4096
# Each decoder holds a few chunks: the thread count, not the data, sets the memory. Measured on 2
# cores, 1 GB: 2 threads 2.07x gzip -dc with a 60 MB child, 3 threads 2.14x with 79 MB.
MAX_THREADS = 3
_F_SETPIPE_SZ = 1031  # Linux: a 1 MiB pipe means fewer, larger writes from the decoder
_PIPE_BYTES = 1024 * 1024
_READ_STEP = 1024 * 1024
_CLI = "import sys, rapidgzip; sys.exit(rapidgzip.cli())"
# Measured peaks of the child on 1 GB of weights-like data: 50-96 MB. Past this it is not such data.
# The validator itself peaks near 110 MB on the worst header bomb, so the two stay under 256 MB.
MAX_CHILD_RSS = 128 * 1024 * 1024
_WATCH_SECONDS = 0.005
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def available() -> bool:
    """rapidgzip is installed, and /proc lets the watchdog see the child's memory."""
    return importlib.util.find_spec("rapidgzip") is not None and os.path.exists("/proc/self/statm")


class ParallelInflate:
    """The decompressed bytes of one gzip file, forward only.

    `seek` ahead discards in the kernel; `seek(0, SEEK_END)` drains to the end and returns the
    total. `finished()` says whether the decoder ended cleanly; it does not see a stream cut
    inside a deflate block (rapidgzip stops there quietly), so the caller checks the trailer.
    """

    def __init__(self, path: Path, compressed_size: int, decompressed_hint: int) -> None:
        threads = min(os.cpu_count() or 1, MAX_THREADS)
        options = ["-d", "-c", "-P", str(threads), "--chunk-size", str(CHUNK_KIB)]
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _CLI, *options, str(path.resolve())],  # absolute: never read as an option
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,  # its errors send the file to the sequential inflater, which names them
        )
        assert self._proc.stdout is not None
        self._fd = self._proc.stdout.fileno()
        # An older kernel or a lower pipe-max-size refuses: the default pipe still works.
        with contextlib.suppress(OSError):
            fcntl.fcntl(self._fd, _F_SETPIPE_SZ, _PIPE_BYTES)
        self._null = os.open(os.devnull, os.O_WRONLY)
        self._position = 0
        self._ratio = compressed_size / max(decompressed_hint, 1)
        self._compressed_size = compressed_size
        self.over_memory = False
        self._watch_stop = threading.Event()
        self._watch = threading.Thread(target=self._watch_memory, name="inflate-watchdog", daemon=True)
        self._watch.start()

    def _watch_memory(self) -> None:
        statm = f"/proc/{self._proc.pid}/statm"
        while not self._watch_stop.wait(_WATCH_SECONDS):
            try:
                with open(statm, "rb") as fh:
                    resident = int(fh.read().split()[1]) * _PAGE
            except (OSError, IndexError, ValueError):  # the child has exited
                return
            if resident > MAX_CHILD_RSS:
                self.over_memory = True
                self._proc.kill()
                return

    def read(self, n: int = -1) -> bytes:
        out = bytearray()
        while n < 0 or len(out) < n:
            block = os.read(self._fd, _READ_STEP if n < 0 else min(n - len(out), _READ_STEP))
            if not block:
                break
            out += block
        self._position += len(out)
        return bytes(out)

    def tell(self) -> int:
        return self._position

    def seekable(self) -> bool:
        return True  # forward only; tarfile's seekable mode seeks only forward

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        if whence == os.SEEK_END:
            target = sys.maxsize
        elif whence == os.SEEK_CUR:
            target = self._position + offset
        else:
            target = offset
        if target < self._position:
            raise OSError(f"cannot seek back in a parallel inflate (to {target} from {self._position})")
        while self._position < target:
            moved = os.splice(self._fd, self._null, min(target - self._position, 1 << 30))
            if not moved:
                break
            self._position += moved
        return self._position

    def compressed_position(self) -> int:
        """An estimate, from the trailer's size: for progress, never for a decision."""
        return min(int(self._position * self._ratio), self._compressed_size)

    def finished(self) -> bool:
        """Drained to the end, and the decoder exited 0 (its CRC and length checks held)."""
        self.seek(0, os.SEEK_END)
        return self._proc.wait() == 0 and not self.over_memory

    def close(self) -> None:
        if self._null < 0:
            return
        if self._proc.poll() is None:
            self._proc.kill()  # refused or failed part way: the decoder must not run on
        self._proc.wait()
        self._watch_stop.set()
        self._watch.join()
        assert self._proc.stdout is not None
        self._proc.stdout.close()
        os.close(self._null)
        self._null = -1

    def __enter__(self) -> ParallelInflate:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
