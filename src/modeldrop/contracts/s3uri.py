"""Parsing of s3:// URIs into bucket and key."""

from __future__ import annotations

import re
from dataclasses import dataclass

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
BUCKET_PATTERN = r"[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]"
_BUCKET = re.compile(f"^{BUCKET_PATTERN}$")
# The same rules as a JSON Schema pattern (ECMA-262 and Python alike): a key of no control character
# and no '..' segment.
_KEY_CHAR = r"[^\x00-\x1f\x7f]"
_NO_DOTDOT = rf"(?!(?:{_KEY_CHAR}*/)?\.\.(?:/|$))"
S3_URI_PATTERN = rf"^s3://{BUCKET_PATTERN}(?:/{_NO_DOTDOT}{_KEY_CHAR}*)?$"
# An artifact: a key ending in .tar.gz, or a prefix ending in '/'.
ARTIFACT_URI_PATTERN = rf"^s3://{BUCKET_PATTERN}/{_NO_DOTDOT}(?:{_KEY_CHAR}*\.tar\.gz|{_KEY_CHAR}*/)$"


@dataclass(frozen=True)
class S3Uri:
    bucket: str
    key: str

    @property
    def is_prefix(self) -> bool:
        return self.key == "" or self.key.endswith("/")

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.key}"


def parse_s3_uri(uri: str) -> S3Uri:
    if not uri.startswith("s3://"):
        raise ValueError(f"not an s3:// URI: {uri!r}")
    rest = uri[len("s3://") :]
    bucket, _, key = rest.partition("/")
    if not _BUCKET.match(bucket):
        raise ValueError(f"invalid bucket name in {uri!r}")
    if ".." in key.split("/"):
        raise ValueError(f"'..' is not allowed in an S3 key: {uri!r}")
    if _CONTROL.search(key):
        raise ValueError(f"an S3 key with a control character (newline, tab, NUL...) is refused: {uri[:200]!r}")
    return S3Uri(bucket, key)
