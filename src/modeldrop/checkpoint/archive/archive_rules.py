"""The archive rules: each refusal of a tar(.gz) by its structure has a finding code and a fix.

Validation judges the tree that `tar -xzf` would leave. Where GNU tar and another reader could
build different trees from one archive, or extraction would replace one file with another, the
archive is refused by one of these rules (exit 1), never read one way and served the other. An
archive whose bytes cannot be read at all (a truncated or corrupt stream) is CheckpointUnreadable
(exit 2) instead. docs/validation.md, "Finding codes", lists them all.
"""

from __future__ import annotations

from modeldrop.contracts.errors import CheckpointRefused

_REBUILD = "rebuild the archive with GNU tar or Python's tarfile: tar -czf model.tar.gz -C MODEL_DIR ."

ARCHIVE_RULES: dict[str, str] = {
    "ARCHIVE_LINK": "archive only regular files: tar --dereference --hard-dereference -czf model.tar.gz -C MODEL_DIR . "
    "(--dereference alone still stores files with several names as hard links)",
    "ARCHIVE_SPECIAL_FILE": "a model directory holds regular files only; remove devices and FIFOs, then " + _REBUILD,
    "ARCHIVE_MEMBER_TYPE": "the member type (sparse, volume label, multi-volume, vendor) is not one every tar reads "
    "alike; " + _REBUILD,
    "ARCHIVE_ABSOLUTE_PATH": "archive relative paths: " + _REBUILD,
    "ARCHIVE_PATH_ESCAPE": "a member path with '..' would land outside the model directory; " + _REBUILD,
    "PREFIX_KEY_PATH": "S3 keys under a model prefix are plain relative paths (no '.', '..' or empty segments, "
    "each part at most 255 bytes): SageMaker writes each key as a path under /opt/ml/model, so 'zz/../config.json' "
    "would replace the validated config.json; upload the model directory again (modeldrop upload DIR s3://.../)",
    "ARCHIVE_DUPLICATE_PATH": "two members at one path: extraction keeps only the last; " + _REBUILD,
    "ARCHIVE_EMPTY_NAME": "a file member has no name; " + _REBUILD,
    "ARCHIVE_TOO_MANY_MEMBERS": "a model directory has a few hundred files at most; archive only the model",
    "ARCHIVE_TOO_LARGE": "the archive declares more than 2 TiB: this is not a model archive",
    "DIRECTORY_LINK_OUTSIDE": "copy the real file into the model directory (links may point inside it, or into a "
    "Hugging Face cache's blobs)",
    "FILE_TOO_LARGE": "config.json, the index and tokenizer_config.json are kilobytes; re-save the file",
    "TAR_CHECKSUM": "a header's checksum is wrong (GNU tar skips such a block and reads on); " + _REBUILD,
    "TAR_NUMERIC_FIELD": "a numeric header field is not plain octal (or base-256); " + _REBUILD,
    "TAR_MAGIC": "the header is neither POSIX ustar, GNU nor v7; " + _REBUILD,
    "TAR_GNU_PREFIX": "an old-GNU or v7 header has bytes in the ustar prefix field, which readers join "
    "differently; " + _REBUILD,
    "TAR_SLASH_NAME": "a file member's name ends in '/', which GNU tar extracts as a directory; " + _REBUILD,
    "TAR_DIRECTORY_DATA": "a directory member carries data, which readers skip differently; " + _REBUILD,
    "TAR_NAME_NUL": "a PAX path or linkpath holds a NUL byte, where GNU tar cuts the name; " + _REBUILD,
    "TAR_NAME_CONFLICT": "a member has two name records (GNU long name and PAX path, or two of one kind) that "
    "readers pick between differently; " + _REBUILD,
    "TAR_PAX_INVALID": "a PAX extended header is malformed or has no member after it; " + _REBUILD,
    "TAR_PAX_WHITESPACE": "a PAX record with blanks or tabs around its length, which GNU tar and tarfile read as "
    "different keywords; " + _REBUILD,
    "TAR_NAME_TOO_LONG": "a member path over 4,095 bytes or with a part over 255 bytes cannot be extracted ('File "
    "name too long'); shorten the model's file names, then " + _REBUILD,
    "TAR_PAX_GLOBAL": "a PAX global header sets a path, link or size, which readers apply differently; " + _REBUILD,
    "TAR_SPARSE": "sparse members (GNU.sparse.*) are extracted differently by different readers; archive the "
    "files without --sparse",
    "TAR_LONG_RECORD": "a GNU long name or PAX header over 64 KiB, a PAX header of over 256 records, "
    "or over 8 MiB of them in one archive; " + _REBUILD,
    "TAR_TRAILING_DATA": "the archive has data after its end-of-archive block, which some readers extract; " + _REBUILD,
    "GZIP_RESERVED_FLAGS": "the gzip header sets reserved flags, so GNU gzip refuses it; compress with gzip (tar -czf)",
    "GZIP_HEADER_CRC": "the gzip header's CRC (FHCRC) is wrong, so GNU gzip refuses it; compress with gzip again",
    "GZIP_HEADER_TOO_LONG": "the gzip header's name or comment is over 64 KiB; compress with gzip again",
    "GZIP_TRAILING_DATA": "bytes that are not gzip follow the compressed data; compress with gzip again",
}


def archive_refused(code: str, message: str) -> CheckpointRefused:
    """A refusal by one of the archive rules: a finding (exit 1), not unreadable bytes (exit 2)."""
    exc = CheckpointRefused(message, ARCHIVE_RULES[code])
    exc.code = code
    return exc


NAME_MAX = 255  # bytes in one path component on the hosts' file systems (ENAMETOOLONG past it)


def prefix_key_problem(relative: str) -> str | None:
    """Why an object key under a model prefix cannot be a file of the served model (None: it can):
    a '.', '..' or empty segment names another path once written to disk, and a part past NAME_MAX
    fails only when the endpoint downloads it."""
    parts = relative.split("/")
    if any(p in (".", "..") for p in parts) or "" in parts[:-1]:
        return f"the object key part {relative[:200]!r} has '.', '..' or empty segments"
    if any(len(p.encode()) > NAME_MAX for p in parts):
        return f"the object key part {relative[:80]!r}... has a segment longer than {NAME_MAX} bytes"
    return None


def check_prefix_keys(prefix: str, keys: list[str]) -> None:
    """PREFIX_KEY_PATH for the first key under PREFIX that is not a plain relative path."""
    for key in keys:
        problem = prefix_key_problem(key[len(prefix) :])
        if problem is not None:
            raise archive_refused("PREFIX_KEY_PATH", f"{problem} (under {prefix[:200]!r})")
