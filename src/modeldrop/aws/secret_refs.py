"""Secrets by reference: the request, the state and the record hold only where a secret lives.

A reference is `secretsmanager:<name or ARN>` (optionally `#<json key>`) or `ssm:<parameter name>`.
Values are read only when the model is created, go straight into the container env, and are never
logged, recorded or returned.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from botocore.exceptions import ClientError

from modeldrop.contracts.errors import RequestInvalid

if TYPE_CHECKING:
    from mypy_boto3_secretsmanager import SecretsManagerClient
    from mypy_boto3_ssm import SSMClient

ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]{0,127}$")
_REF = re.compile(r"^(?P<store>secretsmanager|ssm):(?P<name>[^#\s]+)(?:#(?P<key>[^\s]+))?$")
_ARN_NAME = re.compile(r"^arn:aws[a-z-]*:secretsmanager:[a-z0-9-]+:\d{12}:secret:(?P<name>.+)$")


@dataclass(frozen=True)
class SecretRef:
    store: str
    name: str
    key: str | None = None

    @property
    def display(self) -> str:
        return f"{self.store}:{self.name}" + (f"#{self.key}" if self.key else "")


def parse_ref(env_name: str, ref: str) -> SecretRef:
    if not ENV_NAME.match(env_name):
        raise RequestInvalid(f"secret env name {env_name!r} is not an environment variable name")
    m = _REF.match(ref)
    if m is None:
        # Never repeated: a value where a reference belongs may be the secret itself.
        raise RequestInvalid(
            f"secret {env_name}: its value is not a reference (not shown: it may be the secret itself)",
            "use secretsmanager:<name or ARN>[#json-key] or ssm:<parameter name>; never the value itself",
        )
    if m["store"] == "ssm" and m["key"]:
        raise RequestInvalid(f"secret {env_name}: an ssm reference has no #key")
    return SecretRef(m["store"], m["name"], m["key"])


def parse_refs(secrets: Mapping[str, str]) -> dict[str, SecretRef]:
    return {env_name: parse_ref(env_name, ref) for env_name, ref in secrets.items()}


# Names under which containers read a Hugging Face Hub token.
HUB_TOKEN_NAMES = frozenset({"HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HUGGINGFACE_HUB_TOKEN", "HF_API_TOKEN"})


def for_container(refs: Mapping[str, SecretRef], hub_download: bool) -> dict[str, SecretRef]:
    """The references whose values go into the container env: a Hub token only when the container
    downloads from the Hub (the weights come from S3), since DescribeModel shows the env in plain text."""
    return {name: ref for name, ref in refs.items() if hub_download or name not in HUB_TOKEN_NAMES}


def refuse_collisions(secrets: Mapping[str, str], env: Mapping[str, str]) -> None:
    clash = sorted(set(secrets) & set(env))
    if clash:
        raise RequestInvalid(f"secret {clash[0]} would overwrite an engine setting of the plan")


def check_refs(secrets: Mapping[str, str], allowed_prefix: str, engine_keys: set[str]) -> dict[str, SecretRef]:
    """Parse every reference and refuse those this stack may not read (IAM is scoped to the prefix)."""
    parsed = parse_refs(secrets)
    refuse_collisions(secrets, dict.fromkeys(engine_keys, ""))
    for env_name, secret in parsed.items():
        name = secret.name
        arn = _ARN_NAME.match(name)
        bare = arn["name"] if arn else name
        if not bare.lstrip("/").startswith(allowed_prefix.lstrip("/")):
            raise RequestInvalid(
                f"secret {env_name}: {secret.display} is outside this stack's secrets prefix {allowed_prefix!r}",
                f"store it under {allowed_prefix} (the functions may read nothing else)",
            )
    return parsed


def resolve(secretsmanager: SecretsManagerClient, ssm: SSMClient, refs: Mapping[str, SecretRef]) -> dict[str, str]:
    """Read the values. Errors name the reference, never a value."""
    values: dict[str, str] = {}
    for env_name, ref in refs.items():
        try:
            if ref.store == "ssm":
                value = ssm.get_parameter(Name=ref.name, WithDecryption=True)["Parameter"]["Value"]
            else:
                value = secretsmanager.get_secret_value(SecretId=ref.name)["SecretString"]
                if ref.key is not None:
                    value = json.loads(value)[ref.key]
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code")
            raise RequestInvalid(f"secret {env_name}: cannot read {ref.display} ({code})") from None
        except (KeyError, json.JSONDecodeError, TypeError):
            raise RequestInvalid(f"secret {env_name}: {ref.display} has no JSON key {ref.key!r}") from None
        values[env_name] = str(value)
    return values
