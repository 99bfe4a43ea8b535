"""Hostile archives built on the fly: each a name, a builder, the exit code and finding code expected."""

from __future__ import annotations

import gzip
import io
import tarfile
from collections.abc import Callable
from pathlib import Path

Builder = Callable[[Path], Path]


def _tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]], compress: bool = True) -> Path:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    blob = raw.getvalue()
    path.write_bytes(gzip.compress(blob, compresslevel=1) if compress else blob)
    return path


def _file(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def _dir(name: str) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    return info, None


def _special(name: str, kind: bytes, target: str = "") -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = target
    return info, None


def checkpoint_members(checkpoint: Path) -> list[tuple[tarfile.TarInfo, bytes]]:
    return [_file(p.name, p.read_bytes()) for p in sorted(checkpoint.iterdir())]


def builders(checkpoint: Path) -> dict[str, tuple[Builder, int, str | None]]:
    """name -> (builder, the exit code of `validate`, the finding code of a refusal)."""
    good = checkpoint_members(checkpoint)
    config = (checkpoint / "config.json").read_bytes()
    big_zero = b"\0" * (64 * 1024 * 1024)

    def zero_bomb(path: Path) -> Path:
        # Sixteen 64 MiB members that gzip to ~1 MB: none is read, so memory stays flat.
        return _tar(path, [*good, *(_file(f"notes/{i}.txt", big_zero) for i in range(16))])

    def many_members(path: Path) -> Path:
        raw = io.BytesIO()
        with tarfile.open(fileobj=raw, mode="w") as tar:
            for i in range(60_000):
                tar.addfile(tarfile.TarInfo(f"e/{i}"), io.BytesIO(b""))
        path.write_bytes(gzip.compress(raw.getvalue(), compresslevel=1))
        return path

    def corrupt_deflate(path: Path) -> Path:
        blob = bytearray(_tar(path, good).read_bytes())
        for i in range(200, 400):
            blob[i] ^= 0x5A
        path.write_bytes(bytes(blob))
        return path

    def truncated(path: Path) -> Path:
        blob = _tar(path, good).read_bytes()
        path.write_bytes(blob[: len(blob) // 2])
        return path

    return {
        "duplicate config.json": (lambda p: _tar(p, [*good, _file("config.json", b"{}")]), 1, "ARCHIVE_DUPLICATE_PATH"),
        "duplicate config.json, second one huge": (
            lambda p: _tar(p, [*good, _file("config.json", config + b" " * (70 * 1024 * 1024))]),
            1,
            "ARCHIVE_DUPLICATE_PATH",
        ),
        "config.json then a config.json/ directory": (
            lambda p: _tar(p, [*good, _dir("config.json")]),
            1,
            "ARCHIVE_DUPLICATE_PATH",
        ),
        "a file, then a member under it": (
            lambda p: _tar(p, [*good, _file("config.json/x", b"1")]),
            1,
            "ARCHIVE_DUPLICATE_PATH",
        ),
        "dot-dot inside a path": (
            lambda p: _tar(p, [*good, _file("./sub/../config.json", b"{}")]),
            1,
            "ARCHIVE_PATH_ESCAPE",
        ),
        "duplicate after normalization": (
            lambda p: _tar(p, [*good, _file(".//./config.json", b"{}")]),
            1,
            "ARCHIVE_DUPLICATE_PATH",
        ),
        "symlink": (lambda p: _tar(p, [*good, _special("link", tarfile.SYMTYPE, "/etc/passwd")]), 1, "ARCHIVE_LINK"),
        "hardlink": (lambda p: _tar(p, [*good, _special("hard", tarfile.LNKTYPE, "config.json")]), 1, "ARCHIVE_LINK"),
        "device": (lambda p: _tar(p, [*good, _special("dev", tarfile.CHRTYPE)]), 1, "ARCHIVE_SPECIAL_FILE"),
        "absolute path": (lambda p: _tar(p, [*good, _file("/etc/cron.d/x", b"1")]), 1, "ARCHIVE_ABSOLUTE_PATH"),
        "dot-dot path": (lambda p: _tar(p, [*good, _file("../x", b"1")]), 1, "ARCHIVE_PATH_ESCAPE"),
        "oversized config.json": (
            lambda p: _tar(p, [_file("config.json", b"{" + b" " * (17 * 1024 * 1024) + b"}")]),
            1,
            "FILE_TOO_LARGE",
        ),
        "many empty members": (many_members, 1, "ARCHIVE_TOO_MANY_MEMBERS"),
        "corrupt deflate block": (corrupt_deflate, 2, None),
        "truncated gzip": (truncated, 2, None),
        "not gzip": (lambda p: (p.write_bytes(b"not gzip at all " * 100), p)[1], 2, None),
        "non-UTF-8 member name": (lambda p: _tar(p, [*good, _file("bad-\udcff-name.bin", b"x")]), 0, None),
        "markup in member name": (lambda p: _tar(p, [*good, _file("a[/x][bold]b.txt", b"x")]), 0, None),
        "control characters in a name": (lambda p: _tar(p, [*good, _file("c\x1b[31mred.txt", b"x")]), 0, None),
        "zero bomb of unread members": (zero_bomb, 0, None),
        "empty config.json object": (
            lambda p: _tar(p, [*(m for m in good if m[0].name != "config.json"), _file("config.json", b"{}")]),
            1,
            "CONFIG_INCOMPLETE",
        ),
        "config.json is a list": (
            lambda p: _tar(p, [*(m for m in good if m[0].name != "config.json"), _file("config.json", b"[]")]),
            1,
            "JSON_INVALID",
        ),
    }
