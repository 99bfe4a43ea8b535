"""A seeded mutator of tar and gzip headers, for the differential test against GNU tar.

Seeds are small model directories archived by GNU tar (gnu, posix, ustar, v7 formats) and by
Python's tarfile (GNU, PAX, USTAR). Each case applies one to three mutations written byte by byte:
header fields set to values on which readers are known to differ (prefix under old-GNU magic,
malformed numbers, slash-ended file names, type flags), extra name records (GNU long names, PAX
paths with NULs, global headers, sparse keys), data after the end-of-archive block, truncation,
random byte flips; and gzip framing (reserved flags, header CRC, extra fields, several members,
trailing bytes). Checksums are recomputed most of the time, so that deeper rules are reached.
"""

from __future__ import annotations

import gzip
import io
import json
import random
import shutil
import struct
import subprocess
import tarfile
import zlib
from collections.abc import Callable
from pathlib import Path

BLOCK = 512
NAMES = [
    b"config.json",
    b"junk/config.json",
    b"config.json/",
    b"./config.json",
    b"tokenizer_config.json",
    b"model.safetensors",
    b"sub/model.safetensors",
    b"a\x00b",
    b"/etc/x",
    b"../x",
    b"",
    b"c:notes",
    b"model.safetensors.index.json",
    b"x" * 120,
]
NUMBERS = [
    b"12 34\x00",
    b"\x0012345\x00",
    b"+12\x00",
    b"0o12\x00",
    b"1_2\x00",
    b"     \x00",
    b"\x80" + bytes(6) + b"\x10",
    b"\xff" * 8,
    b"0000000\x00",
    b"8\x00",
    b" 17 \x00",
    b"\x00" * 8,
    b"77777777777\x00",
]
TYPES = b"0\x0012345677xgLKSVDMNXA"
FIELDS = {
    "name": (0, 100),
    "mode": (100, 108),
    "uid": (108, 116),
    "gid": (116, 124),
    "size": (124, 136),
    "mtime": (136, 148),
    "typeflag": (156, 157),
    "linkname": (157, 257),
    "magic": (257, 265),
    "devmajor": (329, 337),
    "devminor": (337, 345),
    "prefix": (345, 500),
}
MAGICS = [b"ustar\x0000", b"ustar  \x00", bytes(8), b"ustar\x0001", b"gnutar \x00", b"ustar\x00\x00\x00"]


def _config() -> bytes:
    return json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}).encode()


def _safetensors() -> bytes:
    header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    return struct.pack("<Q", len(header)) + header + bytes(8)


def write_model(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_bytes(_config())
    (root / "tokenizer_config.json").write_bytes(b'{"chat_template": "x"}')
    (root / "model.safetensors").write_bytes(_safetensors())
    deep = root / "sub" / ("d" * 60)  # a path past 100 bytes: the ustar prefix or a long-name record holds it
    deep.mkdir(parents=True, exist_ok=True)
    (deep / ("n" * 50 + ".txt")).write_bytes(b"long name")
    return root


def seeds(workdir: Path) -> list[bytes]:
    """Uncompressed seed archives of one small model directory, by GNU tar and tarfile."""
    model = write_model(workdir / "seed-model")
    out = []
    if shutil.which("tar"):
        for fmt in ("gnu", "posix", "ustar", "oldgnu"):
            target = workdir / f"seed-{fmt}.tar"
            done = subprocess.run(
                ["tar", f"--format={fmt}", "-cf", str(target), "-C", str(model), "."], capture_output=True
            )
            if done.returncode == 0:
                out.append(target.read_bytes())
    if shutil.which("bsdtar"):
        for fmt in ("ustar", "pax", "gnutar", "v7", "paxr"):
            target = workdir / f"seed-bsdtar-{fmt}.tar"
            done = subprocess.run(
                ["bsdtar", "--format", fmt, "-cf", str(target), "-C", str(model), "."], capture_output=True
            )
            if done.returncode == 0:
                out.append(target.read_bytes())
    for fmt in (tarfile.GNU_FORMAT, tarfile.PAX_FORMAT, tarfile.USTAR_FORMAT):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
            tar.add(model, arcname=".")
        out.append(buf.getvalue())
    return out


def checksum(block: bytearray) -> bytearray:
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\x00 " % sum(block)
    return block


def header(name: bytes, size: int, typeflag: bytes = b"0", magic: bytes = b"ustar\x0000", prefix: bytes = b"") -> bytes:
    block = bytearray(BLOCK)
    block[0 : len(name[:100])] = name[:100]
    block[100:108] = b"0000644\x00"
    block[108:116] = block[116:124] = b"0000000\x00"
    block[124:136] = b"%011o\x00" % size
    block[136:148] = b"14000000000\x00"
    block[156:157] = typeflag
    block[257:265] = magic
    block[345 : 345 + len(prefix[:155])] = prefix[:155]
    return bytes(checksum(block))


def member(name: bytes, data: bytes, typeflag: bytes = b"0", **kw: bytes) -> bytes:
    return header(name, len(data), typeflag, **kw) + data + bytes(-len(data) % BLOCK)


def pax(records: list[tuple[bytes, bytes]], typeflag: bytes = b"x") -> bytes:
    body = b""
    for key, value in records:
        core = b" " + key + b"=" + value + b"\n"
        n = len(core) + 1
        while len(str(n).encode()) + len(core) != n:
            n += 1
        body += str(n).encode() + core
    return member(b"PaxHeader", body, typeflag)


# PAX record framings GNU tar's decode_record and tarfile read differently, or not at all: blanks or
# tabs around the length, leading zeros, a NUL where a record starts, a length past the header.
PAX_FRAMES: list[Callable[[bytes, bytes], bytes]] = [
    lambda k, v: b"  " + _framed(b" " + k + b"=" + v + b"\n"),
    lambda k, v: _framed(b"  " + k + b"=" + v + b"\n"),
    lambda k, v: _framed(b"\t" + k + b"=" + v + b"\n"),
    lambda k, v: _framed(b" \t " + k + b"=" + v + b"\n"),
    lambda k, v: b"0" + _framed(b" " + k + b"=" + v + b"\n", extra=1),
    lambda k, v: _framed(b"" + k + b"=" + v + b"\n"),
    lambda k, v: _framed(b" " + k + b"=" + v + b"\n") + b"\x00" * 7,
    lambda k, v: _framed(b" " + k + b"\x00x=" + v + b"\n"),
    lambda k, v: b"999 " + k + b"=" + v + b"\n",
]


def _framed(core: bytes, extra: int = 0) -> bytes:
    n = len(core) + 1
    while len(str(n).encode()) + extra + len(core) != n:
        n += 1
    return str(n).encode() + core


def pax_framed(key: bytes, value: bytes, frame: int, typeflag: bytes = b"x") -> bytes:
    return member(b"PaxHeader", PAX_FRAMES[frame](key, value), typeflag)


def headers(data: bytes) -> list[int]:
    """Offsets of the header blocks a lenient walk finds (sizes read leniently)."""
    offsets, at = [], 0
    while at + BLOCK <= len(data):
        block = data[at : at + BLOCK]
        if block == bytes(BLOCK):
            break
        offsets.append(at)
        size = _size(block)
        if size is None:
            break
        at += BLOCK + -(-size // BLOCK) * BLOCK
    return offsets


def _size(block: bytes) -> int | None:
    raw = block[124:136]
    try:
        return int.from_bytes(raw[1:], "big") if raw[:1] == b"\x80" else int(raw.strip(b" \x00") or b"0", 8)
    except ValueError:
        return None


def end_of_archive(data: bytes) -> int:
    found = headers(data)
    if not found:
        return 0
    last = found[-1]
    size = _size(data[last : last + BLOCK]) or 0
    return min(len(data), last + BLOCK + -(-size // BLOCK) * BLOCK)


def _set_field(rng: random.Random, data: bytearray) -> None:
    spots = headers(bytes(data))
    if not spots:
        return
    at = rng.choice(spots)
    field = rng.choice(list(FIELDS))
    start, end = FIELDS[field]
    if field in ("name", "prefix", "linkname"):
        value = rng.choice([*NAMES, b"junk", b"config.json"])
    elif field == "typeflag":
        value = bytes([rng.choice(TYPES)])
    elif field == "magic":
        value = rng.choice(MAGICS)
    else:
        value = rng.choice(NUMBERS)
    value = value[: end - start]
    data[at + start : at + end] = value + bytes(end - start - len(value))
    if rng.random() < 0.9:
        data[at : at + BLOCK] = checksum(bytearray(data[at : at + BLOCK]))


def _insert_record(rng: random.Random, data: bytearray) -> None:
    spots = headers(bytes(data))
    at = rng.choice(spots) if spots else 0
    name = rng.choice(NAMES)
    kind = rng.randrange(8)
    if kind == 0:
        record = member(b"././@LongLink", name + b"\x00", b"L")
    elif kind == 1:
        record = pax([(b"path", name)])
    elif kind == 2:
        record = pax([(b"path", name), (b"size", rng.choice([b"0", b"5", b"12x", b"99999"]))])
    elif kind == 3:
        record = pax([(rng.choice([b"path", b"comment", b"size"]), name)], typeflag=b"g")
    elif kind == 4:
        record = pax([(b"GNU.sparse.size", b"10"), (b"GNU.sparse.map", b"0,10")])
    elif kind == 5:
        record = member(b"././@LongLink", name + b"\x00", b"L") + pax([(b"path", rng.choice(NAMES))])
    else:
        key = rng.choice([b"path", b"size", b"GNU.sparse.name", b"mtime", b"uid", b"comment"])
        value = name if key in (b"path", b"GNU.sparse.name", b"comment") else rng.choice([b"0", b"12", b"-3", b"1.5x"])
        record = pax_framed(key, value, rng.randrange(len(PAX_FRAMES)))
    data[at:at] = record


def _after_end(rng: random.Random, data: bytearray) -> None:
    end = end_of_archive(bytes(data))
    extra = member(rng.choice([b"config.json", b"extra.json"]), b'{"smuggled": true}')
    if rng.random() < 0.5:
        data[end:] = bytes(BLOCK) + extra + bytes(2 * BLOCK)  # behind a lone zero block
    else:
        data[end:] = bytes(2 * BLOCK) + extra + bytes(2 * BLOCK)


def _flip(rng: random.Random, data: bytearray) -> None:
    spots = headers(bytes(data))
    if not spots:
        return
    at = rng.choice(spots) + rng.randrange(BLOCK)
    data[at] = rng.randrange(256)
    if rng.random() < 0.8:
        start = at - at % BLOCK
        data[start : start + BLOCK] = checksum(bytearray(data[start : start + BLOCK]))


def _truncate(rng: random.Random, data: bytearray) -> None:
    del data[rng.randrange(1, len(data)) :]


def _add_member(rng: random.Random, data: bytearray) -> None:
    end = end_of_archive(bytes(data))
    name = rng.choice(NAMES)
    kind = rng.choice([b"0", b"\x00", b"5", b"7"])
    payload = header(b"config.json", 5) + b"inner" + bytes(507) if rng.random() < 0.5 else b"data"
    magic = rng.choice(MAGICS[:3])
    prefix = rng.choice([b"", b"junk"])
    data[end:end] = member(name, payload, kind, magic=magic, prefix=prefix)


TAR_MUTATIONS: list[Callable[[random.Random, bytearray], None]] = [
    _set_field,
    _set_field,
    _set_field,
    _insert_record,
    _insert_record,
    _after_end,
    _flip,
    _add_member,
    _truncate,
]


def gzip_frame(rng: random.Random, data: bytes) -> bytes:
    """DATA gzipped, sometimes with mutated framing."""
    kind = rng.randrange(8)
    if kind == 0:
        return gzip.compress(data)
    body = zlib.compressobj(6, zlib.DEFLATED, -15)
    deflated = body.compress(data) + body.flush()
    trailer = struct.pack("<II", zlib.crc32(data), len(data) & 0xFFFFFFFF)
    flags = 0
    extra = b""
    if kind == 1:
        flags |= rng.choice([0x20, 0x40, 0x80])
    if kind in (2, 3):
        flags |= 0x02
    if kind == 4:
        flags |= 0x04 | 0x08
        extra = b"\x04\x00AB\x02\x00" + b"model.tar\x00"
    head = bytes([0x1F, 0x8B, 8, flags]) + bytes(6) + extra
    if flags & 0x02:
        crc = zlib.crc32(head) & 0xFFFF
        head += struct.pack("<H", crc if kind == 2 else crc ^ 0x1234)
    framed = head + deflated + trailer
    if kind == 5:
        half = len(data) // 2
        framed = gzip.compress(data[:half]) + gzip.compress(data[half:])
    elif kind == 6:
        framed += rng.choice([bytes(100), b"garbage!", gzip.compress(b"")])
    elif kind == 7:
        framed = framed[: rng.randrange(10, len(framed))]
    return framed


def case(seed: int, bases: list[bytes]) -> tuple[bytes, bool]:
    """The bytes of case SEED and whether they are gzipped."""
    rng = random.Random(seed)
    data = bytearray(rng.choice(bases))
    for _ in range(rng.choice([1, 1, 2, 3])):
        rng.choice(TAR_MUTATIONS)(rng, data)
    if rng.random() < 0.4:
        return gzip_frame(rng, bytes(data)), True
    return bytes(data), False


# ---- judging one case against GNU tar --------------------------------------------------------
def gnu_tar() -> bool:
    found = shutil.which("tar")
    if not found:
        return False
    done = subprocess.run([found, "--version"], capture_output=True, text=True)
    return "GNU tar" in done.stdout


def tree(root: Path) -> dict[bytes, str]:
    """Every non-directory under ROOT: its raw relative path -> its content hash (or link target)."""
    import hashlib
    import os

    out: dict[bytes, str] = {}
    for path in root.rglob("*"):
        rel = os.fsencode(path.relative_to(root).as_posix())
        if path.is_symlink():
            out[rel] = "link:" + os.readlink(path)
        elif path.is_file():
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
        elif not path.is_dir():
            out[rel] = "special"
    return out


def judge(data: bytes, compressed: bool, workdir: Path) -> tuple[str, str]:
    """(verdict, detail): 'agree' (modeldrop accepted; GNU tar left the same tree), 'refused' (a
    modeldrop rule or unreadable; detail is the code and whether GNU tar exited 0), or 'DIFFER'."""
    import os

    from modeldrop.checkpoint.archive.tar_scan import extract_archive, scan_tar_stream
    from modeldrop.contracts.errors import CheckpointRefused, CheckpointUnreadable

    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    archive = workdir / ("case.tar.gz" if compressed else "case.tar")
    archive.write_bytes(data)
    gnu = workdir / "gnu"
    gnu.mkdir()
    flags = "-xzf" if compressed else "-xf"
    done = subprocess.run(
        ["tar", flags, str(archive), "-C", str(gnu), "--no-same-owner", "--no-same-permissions"],
        capture_output=True,
        timeout=30,
    )
    for path in gnu.rglob("*"):  # a mode-000 directory is still walked as root; make sure of it
        if path.is_dir() and not path.is_symlink():
            path.chmod(0o755)
    try:
        scan = scan_tar_stream(io.BytesIO(data), "case", compressed)
    except CheckpointRefused as exc:
        return "refused", f"{exc.code} gnu-exit={done.returncode}"
    except CheckpointUnreadable:
        return "refused", f"UNREADABLE gnu-exit={done.returncode}"
    ours = workdir / "ours"
    extract_archive(archive, ours)
    judged = tree(ours)
    listed = {os.fsencode(p) for p in scan.files}
    if set(judged) != listed:
        return "DIFFER", f"scan listed {sorted(listed)} but extraction made {sorted(judged)}"
    theirs = tree(gnu)
    if judged != theirs:
        return (
            "DIFFER",
            f"modeldrop {sorted(judged.items())} vs GNU tar (exit {done.returncode}) {sorted(theirs.items())}",
        )
    return "agree", f"gnu-exit={done.returncode}"
