"""Names from hostile inputs (archive members, file names, S3 keys) made safe to show and to serialize."""

from __future__ import annotations

from collections.abc import Iterable


def printable(text: str) -> str:
    """TEXT with control characters and undecodable bytes (lone surrogates) written as escapes.

    `a\\x01b` and a tar member name with the byte 0xff (`\\udcff` after surrogateescape) both come
    out as plain, printable, JSON-serializable text that says what was there.
    """
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape", "backslashreplace").decode() for ch in text)


def edit_distance(a: str, b: str) -> int:
    """Optimal-string-alignment distance: insertions, deletions, substitutions and swaps of two neighbours
    each cost one (`us-esat-1` is one swap from `us-east-1`, three edits from `us-west-1`)."""
    previous2: list[int] = []
    previous = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        row = [i]
        for j, y in enumerate(b, 1):
            cost = min(previous[j] + 1, row[j - 1] + 1, previous[j - 1] + (x != y))
            if i > 1 and j > 1 and x == b[j - 2] and a[i - 2] == y:
                cost = min(cost, previous2[j - 2] + 1)
            row.append(cost)
        previous2, previous = previous, row
    return previous[-1]


def nearest(word: str, candidates: Iterable[str], n: int = 1, most: int | None = None) -> list[str]:
    """The N candidates closest to WORD by edit distance (ties in the candidates' order), none further than
    MOST edits (default: a third of WORD's length, at least 2)."""
    bound = most if most is not None else max(2, len(word) // 3)
    scored = sorted((edit_distance(word, c), i, c) for i, c in enumerate(candidates))
    return [c for d, _, c in scored if d <= bound][:n]
