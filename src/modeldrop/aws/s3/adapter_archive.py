"""An adapter's validated files packed as the one `.tar.gz` an adapter inference component takes
(Container.ArtifactUrl must name a single gzip compressed tar archive).

Packed from the served copy the validating pass wrote (the pipeline's own prefix, which only its
functions may write), streamed: tar and gzip write into a pipe that a managed upload reads in
parts, so an adapter of a few GB needs neither its size in memory nor in /tmp."""

from __future__ import annotations

import contextlib
import os
import tarfile
import threading
from typing import TYPE_CHECKING

from modeldrop.contracts.artifact import Artifact

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

# Adapter weights barely compress; the archive exists because the API wants one, not to save bytes.
GZIP_LEVEL = 1


def pack_prefix(s3: S3Client, source: Artifact, target_key: str) -> str:
    """Write every object under SOURCE (a prefix) into s3://<bucket>/TARGET_KEY as a .tar.gz whose
    members are the objects' paths relative to SOURCE; returns the archive's S3 URI."""
    objects = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=source.bucket, Prefix=source.key):
        objects += [(o["Key"], int(o["Size"]), o["ETag"]) for o in page.get("Contents", [])]
    read_fd, write_fd = os.pipe()
    failure: list[BaseException] = []

    def produce() -> None:
        with os.fdopen(write_fd, "wb") as sink:
            try:
                with tarfile.open(fileobj=sink, mode="w|gz", compresslevel=GZIP_LEVEL) as tar:
                    for key, size, etag in sorted(objects):
                        info = tarfile.TarInfo(key[len(source.key) :])
                        info.size, info.mode = size, 0o644
                        body = s3.get_object(Bucket=source.bucket, Key=key, IfMatch=etag)["Body"]
                        tar.addfile(info, body)
            except BaseException as exc:  # the upload below sees a short stream; the cause is raised after
                failure.append(exc)

    writer = threading.Thread(target=produce, daemon=True)
    writer.start()
    with os.fdopen(read_fd, "rb") as stream:
        try:
            s3.upload_fileobj(stream, source.bucket, target_key)
        finally:
            with contextlib.suppress(OSError):
                stream.read()  # let the writer finish even if the upload failed
            writer.join()
    if failure:
        raise failure[0]
    return f"s3://{source.bucket}/{target_key}"
