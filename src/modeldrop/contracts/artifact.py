"""The model artifact a deployment serves: an S3 location of one of the two shapes SageMaker loads.

Parsed once, where the request is read; every step gets this value, never a string whose shape
is guessed again from its suffix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import PlainSerializer, PlainValidator, WithJsonSchema

from modeldrop.contracts.s3uri import ARTIFACT_URI_PATTERN, S3Uri, parse_s3_uri

ArtifactKind = Literal["tar.gz", "prefix"]


@dataclass(frozen=True)
class Artifact(S3Uri):
    """`s3://bucket/key.tar.gz` (ModelDataUrl, a gzip-compressed tar) or `s3://bucket/prefix/`
    (ModelDataSource with CompressionType None: the uncompressed files)."""

    @classmethod
    def parse(cls, uri: str) -> Artifact:
        loc = parse_s3_uri(uri)
        if not loc.key:
            raise ValueError("artifact_uri needs a key or prefix inside the bucket")
        if not loc.is_prefix and not loc.key.endswith(".tar.gz"):
            raise ValueError(
                f"SageMaker cannot load {uri!r}: give s3://bucket/key/model.tar.gz (a gzip-compressed tar) "
                "or s3://bucket/prefix/ (ending in '/') holding the uncompressed safetensors and config files"
            )
        return cls(loc.bucket, loc.key)

    @property
    def kind(self) -> ArtifactKind:
        return "prefix" if self.is_prefix else "tar.gz"

    @property
    def compressed(self) -> bool:
        return self.kind == "tar.gz"

    @property
    def folder(self) -> str:
        """The key prefix the artifact sits in: its own prefix, or the archive's folder."""
        return self.key if self.is_prefix else self.key[: self.key.rfind("/") + 1]


def _artifact(value: object) -> Artifact:
    if isinstance(value, Artifact):
        return value
    if not isinstance(value, str):
        raise ValueError("artifact_uri must be a string")
    return Artifact.parse(value)


# A request or state field holding an artifact: a string on the wire, an Artifact in the code.
ArtifactUri = Annotated[
    Artifact,
    PlainValidator(_artifact),
    PlainSerializer(str, return_type=str),
    WithJsonSchema({"type": "string", "pattern": ARTIFACT_URI_PATTERN}),
]


# What the CLI and the validator read (a superset of what SageMaker loads): any .gz / .tgz is
# inflated, a .tar is read plain.
COMPRESSED_SUFFIXES = (".gz", ".tgz")
ARCHIVE_SUFFIXES = (*COMPRESSED_SUFFIXES, ".tar")


def is_archive(location: str) -> bool:
    """A local path or S3 key naming a tar archive, compressed or not."""
    return location.endswith(ARCHIVE_SUFFIXES)


def is_compressed(location: str) -> bool:
    """The one rule for gzip by name, for every reader of an archive."""
    return location.endswith(COMPRESSED_SUFFIXES)
