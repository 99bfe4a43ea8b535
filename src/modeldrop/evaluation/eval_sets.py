"""Eval sets: JSONL cases read from the built-in set, an s3:// object or a local file, bounded in bytes
and cases (an eval runs inside a Lambda's 900 s: a set of any size could never finish), and pinned
for a channel by content -- the gate judges a candidate on the channel's own cases, never on a set
whoever wrote the bucket last chose.
"""

from __future__ import annotations

import hashlib
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from modeldrop.contracts.channel import EvalSetPin
from modeldrop.contracts.errors import ChannelInvalid, RequestInvalid, describe_validation
from modeldrop.contracts.s3uri import parse_s3_uri
from modeldrop.evaluation.smoke_eval import EvalCase

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

# A smoke eval or a gate runs its cases one after another inside one Lambda invocation: the set's size
# is bounded so that the time budget (the Lambda's remaining time) can be planned against it.
MAX_EVAL_CASES = 200
MAX_EVAL_SET_BYTES = 4 * 1024 * 1024
BUILT_IN = "built-in"


def parse_eval_set(text: str, source: str) -> list[EvalCase]:
    cases: list[EvalCase] = []
    seen: set[str] = set()
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if len(cases) == MAX_EVAL_CASES:
            raise RequestInvalid(
                f"{source} holds more than {MAX_EVAL_CASES} cases",
                f"keep a smoke eval or gate set to {MAX_EVAL_CASES} cases; run larger sets with `modeldrop eval`",
            )
        try:
            case = EvalCase.model_validate_json(line)
        except ValidationError as exc:
            raise RequestInvalid(
                f"{source} line {lineno}: {describe_validation(exc)}", "each line is a JSON object with id and messages"
            ) from None
        if case.id in seen:
            raise RequestInvalid(
                f"{source} line {lineno}: case id {case.id!r} is used twice", "give every case its own id"
            )
        if (case.checks.json_equals_reference or case.checks.min_similarity is not None) and case.reference is None:
            raise RequestInvalid(f"{source} line {lineno}: case {case.id!r} checks against a reference it lacks")
        seen.add(case.id)
        cases.append(case)
    if not cases:
        raise RequestInvalid(f"{source} has no eval cases", "one JSON object per line")
    return cases


def default_eval_set() -> list[EvalCase]:
    return parse_eval_set(_built_in().decode(), "default eval set")


def _built_in() -> bytes:
    return resources.files("modeldrop.evaluation").joinpath("data/default_eval.jsonl").read_bytes()


def read_eval_set(
    source: str | None, s3: S3Client | None = None, version_id: str | None = None
) -> tuple[bytes, str | None]:
    """The set's bytes and, for an S3 object, the version read (VERSION_ID pins one). None: the built-in."""
    if not source:
        return _built_in(), None
    too_big = RequestInvalid(f"eval set {source} is over {MAX_EVAL_SET_BYTES // 1024 // 1024} MiB",
                             f"keep it to {MAX_EVAL_CASES} cases")  # fmt: skip
    if source.startswith("s3://"):
        if s3 is None:
            raise RequestInvalid(f"cannot read eval set {source}: no S3 client was given", "")
        uri = parse_s3_uri(source)
        kwargs: dict[str, Any] = {"Bucket": uri.bucket, "Key": uri.key}
        if version_id:
            kwargs["VersionId"] = version_id
        try:
            got = s3.get_object(**kwargs)
            if int(got.get("ContentLength") or 0) > MAX_EVAL_SET_BYTES:
                raise too_big
            raw = got["Body"].read(MAX_EVAL_SET_BYTES + 1)
        except RequestInvalid:
            raise
        except Exception as exc:  # the eval set is user input: name it, whatever went wrong
            raise RequestInvalid(f"cannot read eval set {source}: {exc}", "") from None
        version = got.get("VersionId")
        found = None if version in (None, "null") else str(version)
    else:
        path = Path(source)
        if not path.is_file():
            raise RequestInvalid(f"eval set {source}: no such file",
                                 "give the path of a JSONL file (one case a line, as docs/evaluation.md shows), "
                                 "or leave --eval-set out for the built-in set")  # fmt: skip
        if path.stat().st_size > MAX_EVAL_SET_BYTES:
            raise too_big
        raw, found = path.read_bytes(), None
    if len(raw) > MAX_EVAL_SET_BYTES:
        raise too_big
    return raw, found


def _decode(raw: bytes, source: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise RequestInvalid(f"eval set {source} is not UTF-8 text", "write it as UTF-8 JSONL") from None


def load_eval_set(source: str | None, s3: S3Client | None = None) -> list[EvalCase]:
    """The default set, an s3:// JSONL object (read with the client passed in) or a local JSONL file."""
    raw, _ = read_eval_set(source, s3)
    return parse_eval_set(_decode(raw, source or "default eval set"), source or "default eval set")


def pin_eval_set(source: str | None, s3: S3Client | None, at: str) -> tuple[EvalSetPin, list[EvalCase]]:
    """SOURCE read once and pinned by content (and by S3 version where the bucket keeps them)."""
    raw, version = read_eval_set(source, s3)
    cases = parse_eval_set(_decode(raw, source or BUILT_IN), source or BUILT_IN)
    pin = EvalSetPin(source=source, version_id=version, sha256=hashlib.sha256(raw).hexdigest(), cases=len(cases),
                     pinned_at=at)  # fmt: skip
    return pin, cases


def pinned_cases(pin: EvalSetPin, s3: S3Client | None) -> list[EvalCase]:
    """The channel's own cases, exactly as pinned: a set changed since (overwritten in the bucket, edited
    on disk) or gone is ChannelInvalid, never judged by."""
    fix = "restore it, or have the operator pin a set: `modeldrop promote DEPLOYMENT --channel C --eval-set s3://...`"
    try:
        raw, _ = read_eval_set(pin.source, s3, pin.version_id)
    except RequestInvalid as exc:
        raise ChannelInvalid(f"the channel's pinned eval set cannot be read: {exc.message}", fix) from None
    if hashlib.sha256(raw).hexdigest() != pin.sha256:
        raise ChannelInvalid(
            f"the channel's eval set {pin.source or BUILT_IN} changed since it was pinned on {pin.pinned_at} "
            f"(sha256 {pin.sha256[:12]}...): the gate judges only the pinned cases",
            fix,
        )
    return parse_eval_set(_decode(raw, pin.source or BUILT_IN), pin.source or BUILT_IN)
