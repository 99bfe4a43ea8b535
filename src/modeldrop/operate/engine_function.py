"""doctor's look at the engine-check function: a container image function that must be Active (or able to
become so), whose image is still in ECR and whose repository lets Lambda pull it again."""

from __future__ import annotations

import fnmatch
import json
import re
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

if TYPE_CHECKING:
    from mypy_boto3_ecr import ECRClient
    from mypy_boto3_lambda import LambdaClient

# A finding: its status ("ok", "warn" or "fail"), what was seen, and the fix (doctor makes it a Check).
Finding = tuple[str, str, str]
# What Lambda needs of the repository to pull the image (on create, and on restoring an Inactive function).
PULL_ACTIONS = ("ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer")
LAMBDA_PRINCIPAL = "lambda.amazonaws.com"
REDEPLOY = "sam build && sam deploy --resolve-image-repos (docs/validation.md, 'The engine check on AWS')"
_IMAGE_URI = re.compile(
    r"^(?P<registry>\d{12})\.dkr\.ecr\.[^/]+/(?P<repo>[^:@]+)(?::(?P<tag>[^@]+))?(?:@(?P<digest>.+))?$"
)


def check_engine_function(lam: LambdaClient, ecr: ECRClient, function_name: str | None) -> Finding:
    if not function_name:
        return "warn", "the stack lists no EngineCheckFunction resource", REDEPLOY
    try:
        function = lam.get_function(FunctionName=function_name)
    except (ClientError, BotoCoreError) as exc:
        return "warn", f"could not read {function_name}: {_code(exc)}", ""
    config, code = function["Configuration"], function.get("Code", {})
    if config.get("PackageType") != "Image":
        why = "a zip function without the engine (a stack from before the image): the static rules judge alone"
        return "fail", f"{function_name} is {why}", REDEPLOY
    state, reason = config.get("State", "Active"), config.get("StateReason", "")
    if state == "Failed" or config.get("LastUpdateStatus") == "Failed":
        why = reason or config.get("LastUpdateStatusReason", "")
        return "fail", f"{function_name} is Failed: {why}", REDEPLOY
    image = _image_problem(ecr, code.get("ImageUri", ""), code.get("ResolvedImageUri", ""))
    if image:
        return image[0], image[1], REDEPLOY if image[0] == "fail" else ""
    disabled = (config.get("Environment") or {}).get("Variables", {}).get("MODELDROP_ENGINE_CHECK") == "Disabled"
    if disabled:
        why = "the stack's EngineCheck parameter is Disabled: the static rules judge alone"
        return "warn", why, "sam deploy --parameter-overrides EngineCheck=Enabled"
    if state in ("Inactive", "Pending"):
        why = "the next EngineCheck waits while Lambda restores it (retried for about ten minutes)"
        return "warn", f"{function_name} is {state} (idle): {why}", ""
    return "ok", f"{state}, image {code.get('ImageUri', '?')}", ""


def _image_problem(ecr: ECRClient, image_uri: str, resolved: str) -> tuple[str, str] | None:
    """Why Lambda could not pull the function's image again ("fail"), or why this caller cannot tell
    ("warn"), or None."""
    match = _IMAGE_URI.match(image_uri)
    if not match:
        return "fail", f"the function's image {image_uri or '(none)'} is not in ECR"
    registry, repo = match["registry"], match["repo"]
    digest = resolved.rpartition("@")[2] if "@" in resolved else match["digest"]
    ident: dict[str, str] = {"imageDigest": digest} if digest else {"imageTag": match["tag"] or "latest"}
    try:
        ecr.describe_images(registryId=registry, repositoryName=repo, imageIds=[ident])
        text = ecr.get_repository_policy(registryId=registry, repositoryName=repo)["policyText"]
    except ClientError as exc:
        code = _code(exc)
        if code in ("ImageNotFoundException", "RepositoryNotFoundException"):
            return "fail", f"the function's image is gone from ECR ({code}: {repo}): restoring an idle function fails"
        if code == "RepositoryPolicyNotFoundException":
            return (
                "fail",
                f"the repository {repo} has no policy: Lambda may not pull the image ({', '.join(PULL_ACTIONS)})",
            )
        return "warn", f"could not read the image's repository {repo} ({code}): its pull policy is unchecked"
    except BotoCoreError as exc:
        return "warn", f"could not read the image's repository {repo} ({_code(exc)}): its pull policy is unchecked"
    try:
        lets = _lets_lambda_pull(json.loads(text))
    except (ValueError, AttributeError, TypeError):
        lets = False
    if not lets:
        return "fail", f"the repository {repo}'s policy does not let {LAMBDA_PRINCIPAL} {' and '.join(PULL_ACTIONS)}"
    return None


def _lets_lambda_pull(policy: dict[str, Any]) -> bool:
    """Whether the policy allows, and does not deny, Lambda every pull action (IAM's wildcards in actions)."""
    allowed: set[str] = set()
    denied: set[str] = set()
    statements = policy.get("Statement", [])
    for statement in statements if isinstance(statements, list) else [statements]:
        principal = statement.get("Principal", {})
        services = principal.get("Service", []) if isinstance(principal, dict) else []
        services = [services] if isinstance(services, str) else services
        if LAMBDA_PRINCIPAL not in services and principal not in ("*", {"AWS": "*"}):
            continue
        actions = statement.get("Action", [])
        matched = {
            a
            for pattern in ([actions] if isinstance(actions, str) else actions)
            for a in PULL_ACTIONS
            if fnmatch.fnmatchcase(a.lower(), str(pattern).lower())
        }
        (allowed if statement.get("Effect") == "Allow" else denied).update(matched)
    return allowed - denied == set(PULL_ACTIONS)


def _code(exc: ClientError | BotoCoreError) -> str:
    return exc.response["Error"]["Code"] if isinstance(exc, ClientError) else type(exc).__name__
