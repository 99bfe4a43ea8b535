"""Names from hostile inputs (archive members, file names, S3 keys) made safe to show and to serialize."""

from __future__ import annotations


def printable(text: str) -> str:
    """TEXT with control characters and undecodable bytes (lone surrogates) written as escapes.

    `a\\x01b` and a tar member name with the byte 0xff (`\\udcff` after surrogateescape) both come
    out as plain, printable, JSON-serializable text that says what was there.
    """
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape", "backslashreplace").decode() for ch in text)
