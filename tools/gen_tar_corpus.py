"""Write the committed tar regression corpus (tests/fixtures/tar-corpus/): one archive per way
GNU tar and other readers are known to disagree, each with the verdict modeldrop must give.

Run from the repo root: .venv/bin/python tools/gen_tar_corpus.py. A case the differential fuzzer
ever finds wrong is added here (by its seed) and so stays tested.
"""

from __future__ import annotations

import gzip
import json
import struct
import sys
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "unit"))
from tar_mutator import BLOCK, _config, _safetensors, checksum, header, member, pax  # noqa: E402

OUT = ROOT / "tests" / "fixtures" / "tar-corpus"
END = bytes(2 * BLOCK)


def model(extra: bytes = b"", skip: tuple[bytes, ...] = ()) -> bytes:
    files = [
        (b"config.json", _config()),
        (b"tokenizer_config.json", b'{"chat_template": "x"}'),
        (b"model.safetensors", _safetensors()),
    ]
    return b"".join(member(n, d) for n, d in files if n not in skip) + extra


def set_bytes(block: bytes, start: int, value: bytes) -> bytes:
    out = bytearray(block)
    out[start : start + len(value)] = value
    return bytes(checksum(out))


def gz_with(data: bytes, flags: int, head_crc: int | None = None) -> bytes:
    body = zlib.compressobj(6, zlib.DEFLATED, -15)
    deflated = body.compress(data) + body.flush()
    head = bytes([0x1F, 0x8B, 8, flags]) + bytes(6)
    if flags & 0x02:
        crc = zlib.crc32(head) & 0xFFFF
        head += struct.pack("<H", crc if head_crc is None else head_crc)
    return head + deflated + struct.pack("<II", zlib.crc32(data), len(data))


def cases() -> dict[str, tuple[bytes, str | None]]:
    """file name -> (bytes, the finding code modeldrop refuses with, or None: accepted, GNU tar agrees)."""
    smuggled = member(b"config.json", b'{"architectures": ["Evil"]}')
    prefixed = member(b"config.json", _config(), magic=b"ustar  \x00", prefix=b"junk")
    long_config = member(b"././@LongLink", b"config.json\x00", b"L")
    long_notes = member(b"././@LongLink", b"notes.json\x00", b"L")
    any_member = member(b"x.json", b"{}")
    bad_sum = bytearray(member(b"extra.json", b"{}"))
    bad_sum[148:156] = b"0000001\x00"
    return {
        "oldgnu-prefix.tar": (
            model(skip=(b"config.json",)) + prefixed + END,
            "TAR_GNU_PREFIX",
        ),
        "ustar-prefix.tar": (model(member(b"notes.txt", b"x", prefix=b"docs")) + END, None),
        "pax-path-nul.tar": (model(pax([(b"path", b"config.json\x00junk")]) + any_member) + END, "TAR_NAME_NUL"),
        "longname-vs-pax-path.tar": (
            model(long_config + pax([(b"path", b"other.json")]) + any_member) + END,
            "TAR_NAME_CONFLICT",
        ),
        "longname-and-equal-pax-path.tar": (
            model(long_notes + pax([(b"path", b"notes.json")]) + any_member) + END,
            None,
        ),
        "regular-member-named-like-a-dir.tar": (
            model(skip=(b"model.safetensors",)) + member(b"shard/", member(b"model.safetensors", _safetensors())) + END,
            "TAR_SLASH_NAME",
        ),
        "old-regular-with-slash-then-pax-name.tar": (
            model(pax([(b"path", b"notes.json")]) + member(b"dir/", b"{}", b"\x00")) + END,
            "TAR_SLASH_NAME",
        ),
        "size-with-inner-space.tar": (
            model(set_bytes(header(b"notes.txt", 0), 124, b"12 34\x00\x00\x00\x00\x00\x00\x00") + smuggled) + END,
            "TAR_NUMERIC_FIELD",
        ),
        "nul-before-digits.tar": (
            model(set_bytes(header(b"notes.txt", 0), 100, b"\x000000644") + smuggled) + END,
            "TAR_NUMERIC_FIELD",
        ),
        "malformed-devmajor-on-a-file.tar": (
            model(set_bytes(header(b"notes.txt", 0), 329, b"zz\x00\x00\x00\x00\x00\x00") + smuggled) + END,
            "TAR_NUMERIC_FIELD",
        ),
        "bad-checksum-mid-archive.tar": (model(bytes(bad_sum) + smuggled) + END, "TAR_CHECKSUM"),
        "header-after-end-of-archive.tar": (model() + bytes(BLOCK) + smuggled + END, "TAR_TRAILING_DATA"),
        "global-pax-path.tar": (model(pax([(b"path", b"config.json")], b"g") + any_member) + END, "TAR_PAX_GLOBAL"),
        "global-pax-comment.tar": (pax([(b"comment", b"0123abcd")], b"g") + model() + END, None),
        "pax-sparse.tar": (model(pax([(b"GNU.sparse.size", b"100")]) + member(b"s.bin", b"x")) + END, "TAR_SPARSE"),
        "two-pax-headers-one-member.tar": (
            model(pax([(b"path", b"a.json")]) + pax([(b"path", b"b.json")]) + member(b"x", b"{}")) + END,
            "TAR_NAME_CONFLICT",
        ),
        "colon-name-is-relative.tar": (model(member(b"c:notes", b"x")) + END, None),
        "names-escaping-alike.tar": (model(member(b"a\x01.txt", b"1") + member(b"a\\x01.txt", b"2")) + END, None),
        "pax-size-override.tar": (model(pax([(b"size", b"3")]) + member(b"n.txt", b"abc")) + END, None),
        "gzip-reserved-flag.tar.gz": (gz_with(model() + END, 0x20), "GZIP_RESERVED_FLAGS"),
        "gzip-wrong-header-crc.tar.gz": (gz_with(model() + END, 0x02, head_crc=0x1234), "GZIP_HEADER_CRC"),
        "gzip-right-header-crc.tar.gz": (gz_with(model() + END, 0x02), None),
        "gzip-two-members.tar.gz": (gzip.compress(model()) + gzip.compress(END), None),
        "gzip-trailing-zeros.tar.gz": (gzip.compress(model() + END) + bytes(64), None),
        "gzip-trailing-garbage.tar.gz": (gzip.compress(model() + END) + b"garbage!", "GZIP_TRAILING_DATA"),
    }


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for old in OUT.iterdir():
        old.unlink()
    expected = {}
    for name, (data, code) in sorted(cases().items()):
        (OUT / name).write_bytes(data)
        expected[name] = code
    (OUT / "expected.json").write_text(json.dumps(expected, indent=2, sort_keys=True) + "\n")
    print(f"wrote {len(expected)} cases to {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
