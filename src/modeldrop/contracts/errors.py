"""Domain errors.

The class name is the error name Step Functions sees (a Lambda's ``errorType``), so the ASL routes
on these names: renaming a class is an interface change (tests/test_contracts.py checks that every
one is routed).
"""

from __future__ import annotations

import json

from pydantic import ValidationError


class ModeldropError(Exception):
    """A failure with a cause the user can act on."""

    failure_class: str = "internal"
    default_hint: str = ""

    def __init__(self, message: str, hint: str | None = None) -> None:
        self.message = message
        self.hint = hint if hint is not None else self.default_hint
        super().__init__(f"{message} -- fix: {self.hint}" if self.hint else message)


class RequestInvalid(ModeldropError):
    failure_class = "request"
    default_hint = "correct the request; its JSON Schema is schemas/deployment-request.schema.json"


class CheckpointUnreadable(ModeldropError):
    failure_class = "checkpoint"
    default_hint = "re-upload a complete model.tar.gz or safetensors prefix"


class CheckpointRefused(ModeldropError):
    failure_class = "checkpoint"
    default_hint = "see the findings in the validation report"
    # The finding code of an archive rule (docs/validation.md: "Finding codes"), where one refused the artifact.
    code: str | None = None


class EngineCheckFailed(ModeldropError):
    """The engine's own check died (its memory or time bound, a signal): the checkpoint was not judged, and
    a checkpoint that was not judged does not pass."""

    failure_class = "checkpoint"
    default_hint = (
        "find what makes the checkpoint huge for the engine (experts, layers, tensors); or give the EngineCheck "
        "function more memory, or deploy with the stack's EngineCheck Disabled to accept the static verdict alone"
    )


class ImageUnresolvable(ModeldropError):
    failure_class = "serving-plan"
    default_hint = "set the engine's *_IMAGE_URI or version variable to a known image"


class PlanRefused(ModeldropError):
    failure_class = "serving-plan"
    default_hint = "lower max_num_seqs / max_model_len or choose a larger instance type"


class QuotaExceeded(ModeldropError):
    """SageMaker's ResourceLimitExceeded: retrying cannot help, a quota increase can."""

    failure_class = "capacity"
    default_hint = (
        "request a Service Quotas increase for 'ml.<type> for endpoint usage' (service code "
        "sagemaker), or pick an instance type with quota"
    )


class ExecutionRoleUnusable(ModeldropError):
    """The stack's SageMaker execution role is missing or does not trust sagemaker.amazonaws.com:
    CreateModel would fail (or the endpoint never start) after minutes of validation and copying."""

    failure_class = "configuration"
    default_hint = "give the role a trust policy for sagemaker.amazonaws.com (see `modeldrop doctor`)"


class DuplicateDeployment(ModeldropError):
    """The same artifact version is already deployed (or being deployed) by another execution."""

    failure_class = "request"
    default_hint = (
        "follow the deployment named above (`modeldrop status ID`); a pipeline that starts deployments itself "
        "should write its artifacts under direct/, which the S3 rule ignores"
    )


class ResourceNameTaken(ModeldropError):
    """A SageMaker name this deployment needs is held by something else: nothing of it is touched."""

    failure_class = "request"
    default_hint = "delete or rename the other resource, or deploy with another ResourcePrefix"


class SageMakerThrottled(ModeldropError):
    """Transient: the ASL retries this with backoff."""

    failure_class = "throttled"
    default_hint = "transient; retried automatically"


class EndpointFailed(ModeldropError):
    failure_class = "endpoint"
    default_hint = (
        "read the endpoint's CloudWatch logs: an engine OOM needs a smaller max_num_seqs or a "
        "larger instance; slow weight loading needs a longer startup health-check timeout"
    )


class InsufficientCapacity(ModeldropError):
    """The endpoint got no instance of its type (InsufficientInstanceCapacity, or a capacity wait that
    will not end): the next instance type of the request's list is tried."""

    failure_class = "capacity"
    default_hint = "another instance type, another region, or a SageMaker capacity reservation"


class CapacityUnavailable(ModeldropError):
    """Every instance type of the request's list was tried; none had capacity (or quota)."""

    failure_class = "capacity"
    default_hint = (
        "try another region, reserve capacity (SageMaker training plans / capacity reservations), request a "
        "quota increase for another type, or add types to instance_types (or use instance_types: auto)"
    )


class StepContractViolated(ModeldropError):
    """A step was handed a payload that does not match its model: a modeldrop bug, not the request's."""

    failure_class = "internal"
    default_hint = "this is a modeldrop bug: report it with the execution's history; the request itself may be fine"


class DeployDeadlineExceeded(ModeldropError):
    failure_class = "endpoint"
    default_hint = "raise the DeployDeadlineSeconds parameter or check the endpoint's logs"


class EvalFailed(ModeldropError):
    failure_class = "eval"
    default_hint = "see the eval report: raise max_tokens for truncated cases, fix the model otherwise"


class LimitExceeded(ModeldropError):
    """The request asks for more than the stack allows (instance types, count, hourly price, TTL, or a
    setting that turns a safety off): no request can raise a stack's limits."""

    failure_class = "request"
    default_hint = "ask within the stack's limits, or have its owner raise the parameter named"


class ArchiveTooLarge(ModeldropError):
    """The artifact is larger than the validating step can read within its time limit (the stack's
    MaxArchiveGB, derived from a measured rate): refused at registration, before anything is copied."""

    failure_class = "request"
    default_hint = "deploy it as an uncompressed S3 prefix: modeldrop upload MODEL_DIR s3://BUCKET/PREFIX/"


class DeploymentEnded(ModeldropError):
    """The deployment's record already ended (aborted, timed out, failed, torn down or expired) while
    a step was still running: the step released what it had created and did nothing more."""

    failure_class = "aborted"
    default_hint = "nothing to do: the deployment was stopped; start a new one to deploy again"


class RecordNotOwned(ModeldropError):
    """The deployment id's record belongs to another execution: nothing of it is touched."""

    failure_class = "internal"
    default_hint = "start the deployment again under a new execution name"


class RegistryBusy(ModeldropError):
    """The deployments table throttled or failed transiently after the SDK's own retries: the state
    machine retries the step with backoff."""

    failure_class = "throttled"
    default_hint = "transient; retried automatically"


class TeardownIncomplete(ModeldropError):
    failure_class = "teardown"
    default_hint = "delete the listed resources by hand or let the reaper retry"


class PromotionBlocked(ModeldropError):
    """The champion/challenger gate found the candidate worse than the version serving the channel."""

    failure_class = "eval"
    default_hint = "see the gate report's per-case deltas; fix the fine-tune, or raise the gate's thresholds"


class PromotionFailed(ModeldropError):
    """The channel's endpoint did not take the candidate: rolled back (an alarm) or silently kept the old config."""

    failure_class = "endpoint"
    default_hint = "the channel still serves its previous version; see the reason, then promote again"


class EvalOutOfTime(ModeldropError):
    """An eval that must finish (the channel's gate: a verdict on half the cases judges nothing) would
    outlive its Lambda: it stops before the next case, saying how many ran."""

    failure_class = "request"
    default_hint = "gate on fewer or shorter cases (the operator pins the channel's set: promote --eval-set)"


class ChannelInvalid(ModeldropError):
    """A promotion or rollback the channel cannot take (no such channel, nothing to roll back to, ...)."""

    failure_class = "request"
    default_hint = "modeldrop channels lists each channel with its live and kept versions"


DOMAIN_ERRORS: tuple[type[ModeldropError], ...] = (
    RequestInvalid,
    CheckpointUnreadable,
    CheckpointRefused,
    EngineCheckFailed,
    ImageUnresolvable,
    PlanRefused,
    DuplicateDeployment,
    ExecutionRoleUnusable,
    ResourceNameTaken,
    QuotaExceeded,
    SageMakerThrottled,
    EndpointFailed,
    InsufficientCapacity,
    CapacityUnavailable,
    DeployDeadlineExceeded,
    EvalFailed,
    TeardownIncomplete,
    StepContractViolated,
    DeploymentEnded,
    RecordNotOwned,
    RegistryBusy,
    LimitExceeded,
    ArchiveTooLarge,
)

FAILURE_CLASSES: dict[str, str] = {cls.__name__: cls.failure_class for cls in DOMAIN_ERRORS}


def describe_validation(exc: ValidationError, limit: int = 3) -> str:
    """'field.path: message; ...' for the first ``limit`` problems, as a user should read them."""
    parts = [f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: {_words(e['msg'])}" for e in exc.errors()[:limit]]
    more = len(exc.errors()) - limit
    return "; ".join(parts) + (f" (+{more} more)" if more > 0 else "")


def _words(message: str) -> str:
    """pydantic's message as the user's words: its 'Value error, ' / 'Assertion failed, ' prefix is the
    library's, and a message spanning lines reads as one (no literal newlines in a one-line error)."""
    for prefix in ("Value error, ", "Assertion failed, "):
        message = message.removeprefix(prefix)
    return " ".join(message.split())


def classify(error_name: str) -> str:
    """Failure class of an error name as Step Functions reports it."""
    if error_name in FAILURE_CLASSES:
        return FAILURE_CLASSES[error_name]
    if error_name in ("States.Timeout", "Sandbox.Timedout"):  # the task's limit, or the Lambda's own
        return "timeout"
    if error_name.startswith("Lambda."):
        return "lambda"
    if error_name.startswith("States."):
        return "internal"
    return "internal"


def cause_message(cause: str | None) -> str | None:
    """A Step Functions failure cause is the Lambda error payload as JSON: keep its errorMessage."""
    if not cause:
        return cause
    try:
        parsed = json.loads(cause)
    except json.JSONDecodeError:
        return cause
    if isinstance(parsed, dict) and "errorMessage" in parsed:
        return str(parsed["errorMessage"])
    return cause
