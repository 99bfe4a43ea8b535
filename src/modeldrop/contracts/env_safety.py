"""What a container env value may hold, and how a token looks.

The vLLM and SGLang DLC entrypoints read their env line by line to build the engine's command
line: a newline (or any control character) inside a value could add flags the plan refuses as
keys. A raw credential in `engine_env` would be copied into the execution history, the logs, the
record and DescribeModel: credentials go by reference (`secrets`). Log lines copied into records
are redacted with the same shapes.
"""

from __future__ import annotations

import re
from typing import Any

# An environment variable name as SageMaker's Environment map takes it (and as shells read it).
ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,1023}$")
MAX_ENV_VALUE = 1024  # SageMaker's limit on an Environment value

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

# Credential shapes: Hugging Face, AWS access keys, GitHub, OpenAI/Anthropic-style, Slack, JWTs,
# PEM private keys. Conservative on purpose: a false positive costs a `secrets` reference.
TOKEN_PATTERNS = (
    r"hf_[A-Za-z0-9]{20,}",
    r"(?:AKIA|ASIA|A3T[A-Z0-9])[A-Z0-9]{16}",
    r"gh[pousr]_[A-Za-z0-9]{30,}",
    r"github_pat_[A-Za-z0-9_]{30,}",
    r"sk-[A-Za-z0-9_-]{20,}",
    r"xox[abprs]-[A-Za-z0-9-]{10,}",
    r"eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}",
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----",
)
_TOKEN = re.compile("|".join(TOKEN_PATTERNS))
# A key whose name says it holds a credential, whatever its value looks like.
# (A whole word of the name: MAX_NUM_BATCHED_TOKENS and TOKENIZER are settings, HF_TOKEN is not.)
_SECRET_NAME = re.compile(
    r"(?:^|_)(?:TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|ACCESS_?KEY|CREDENTIALS?|PRIVATE_?KEY)(?:_|$)", re.I
)

# Raw keys that would make the engine import the checkpoint's own code: only the plan-checked
# engine_settings.trust_remote_code may turn that on, and only where the stack allows it.
REMOTE_CODE_KEYS = frozenset({"SM_VLLM_TRUST_REMOTE_CODE", "SM_SGLANG_TRUST_REMOTE_CODE", "OPTION_TRUST_REMOTE_CODE"})


def env_problem(key: str, value: str) -> str | None:
    """Why KEY=VALUE may not go into a container env as a raw engine key (None: it may). The value
    itself is never repeated in the answer."""
    if not ENV_KEY.match(key):
        return f"{key[:80]!r} is not an environment variable name (letters, digits and _, not starting with a digit)"
    if _CONTROL.search(value):
        return (
            f"{key} holds a control character (newline, tab, NUL...): the engine entrypoints read their env "
            "line by line, so one value could add command-line flags"
        )
    if len(value) > MAX_ENV_VALUE:
        return f"{key} is {len(value)} characters long, over SageMaker's {MAX_ENV_VALUE}"
    if key.upper() in REMOTE_CODE_KEYS:
        return (
            f"{key} would make the engine run the checkpoint's own code: use engine_settings.trust_remote_code, "
            "which the stack must allow"
        )
    if _SECRET_NAME.search(key) or _TOKEN.search(value):
        return (
            f"{key} looks like a credential: a raw value would be kept in the execution history, the logs, the "
            "record and DescribeModel; pass it by reference in `secrets` (secretsmanager:... or ssm:...)"
        )
    return None


def _any_case(pattern: str) -> str:
    """PATTERN (letters, `_`, groups and `?` only) matching either case, without an inline flag: JSON
    Schema's regular expressions (ECMA-262) have none."""
    return "".join(f"[{c.upper()}{c.lower()}]" if c.isalpha() and c.isascii() else c for c in pattern)


def env_json_schema() -> dict[str, Any]:
    """env_problem's rules as JSON Schema (engine_env's keys and values), for the published schemas."""
    remote = "|".join(_any_case(k) for k in sorted(REMOTE_CODE_KEYS))
    return {
        "propertyNames": {
            "pattern": ENV_KEY.pattern,
            "not": {"anyOf": [{"pattern": f"^(?:{remote})$"}, {"pattern": _any_case(_SECRET_NAME.pattern)}]},
        },
        "additionalProperties": {
            "type": "string",
            "maxLength": MAX_ENV_VALUE,
            "not": {"anyOf": [{"pattern": _CONTROL.pattern}, {"pattern": _TOKEN.pattern}]},
        },
    }


def redact(text: str) -> str:
    """TEXT with every credential-shaped run replaced (for log lines copied into records)."""
    return _TOKEN.sub("[redacted]", text)


def looks_like_credential(text: str) -> bool:
    return bool(_TOKEN.search(text))
