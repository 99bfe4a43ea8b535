"""SageMaker model / endpoint-config / endpoint lifecycle, behind a client the caller passes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from botocore.exceptions import ClientError

from modeldrop.aws.pages import all_items
from modeldrop.contracts.errors import QuotaExceeded, ResourceNameTaken, SageMakerThrottled

if TYPE_CHECKING:
    from mypy_boto3_sagemaker import SageMakerClient
    from mypy_boto3_sagemaker.literals import (
        ProductionVariantInferenceAmiVersionType,
        ProductionVariantInstanceTypeType,
    )
    from mypy_boto3_sagemaker.type_defs import (
        ContainerDefinitionTypeDef,
        DescribeEndpointOutputTypeDef,
        ModelDataSourceTypeDef,
        ProductionVariantTypeDef,
        TagTypeDef,
    )

MANAGED_BY_TAG = "modeldrop:managed-by"
DEPLOYMENT_TAG = "modeldrop:deployment-id"
EXPIRES_TAG = "modeldrop:expires-at"

THROTTLE_CODES = {"ThrottlingException", "Throttling", "TooManyRequestsException", "RequestLimitExceeded"}


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _raise_domain(exc: ClientError, what: str) -> None:
    code = _code(exc)
    message = exc.response.get("Error", {}).get("Message", str(exc))
    if code in THROTTLE_CODES:
        raise SageMakerThrottled(f"SageMaker throttled {what}: {message}") from None
    if code == "ResourceLimitExceeded":
        raise QuotaExceeded(f"{what}: {message}") from None


def _is_missing(exc: ClientError) -> bool:
    message = str(exc.response.get("Error", {}).get("Message", ""))
    return _code(exc) in {"ValidationException", "ResourceNotFound"} and (
        "Could not find" in message or "does not exist" in message or "not found" in message.lower()
    )


def tags_for(stack_tag: str, deployment_id: str, expires_at: str) -> list[TagTypeDef]:
    return [
        {"Key": MANAGED_BY_TAG, "Value": stack_tag},
        {"Key": DEPLOYMENT_TAG, "Value": deployment_id},
        {"Key": EXPIRES_TAG, "Value": expires_at},
    ]


def model_data_source(uri: str) -> ModelDataSourceTypeDef:
    """The served prefix as CreateModel is given it: uncompressed files, nothing to extract."""
    return {"S3DataSource": {"S3Uri": uri, "S3DataType": "S3Prefix", "CompressionType": "None"}}


def create_all(
    sm: SageMakerClient,
    name: str,
    image_uri: str,
    model_data_uri: str,
    env: dict[str, str],
    role_arn: str,
    instance_type: str,
    startup_timeout: int,
    download_timeout: int,
    tags: list[TagTypeDef],
    config_name: str | None = None,
    model_name: str | None = None,
    instance_count: int = 1,
    inference_ami_version: str | None = None,
    for_components: bool = False,
) -> list[str]:
    """Create model, endpoint config and endpoint (named ``name``; the config and model too unless
    given their own names), all tagged alike.

    Idempotent for one deployment: a retried step (after a throttle or a Lambda timeout) adopts what
    an earlier attempt created under this deployment's tags instead of failing on the name or
    creating a second set. Returns what it adopted.
    """
    config_name = config_name or name
    model_name = model_name or name
    # Always the uncompressed files (an archive's members were written out as it was validated):
    # SageMaker starts without extracting, and serves the bytes that were validated.
    container: ContainerDefinitionTypeDef = {
        "Image": image_uri,
        "Environment": env,
        "ModelDataSource": model_data_source(model_data_uri),
    }
    variant: ProductionVariantTypeDef = {
        "VariantName": "AllTraffic",
        "InitialInstanceCount": instance_count,
        # Checked against botocore's own list of hosting types when the request was read.
        "InstanceType": cast("ProductionVariantInstanceTypeType", instance_type),
        "ContainerStartupHealthCheckTimeoutInSeconds": startup_timeout,
        "ModelDataDownloadTimeoutInSeconds": download_timeout,
    }
    if not for_components:  # else the model runs in a base inference component, and the config has the role
        variant["ModelName"] = model_name
    if inference_ami_version:  # the host's NVIDIA driver for the image's CUDA (the plan chose it)
        variant["InferenceAmiVersion"] = cast("ProductionVariantInferenceAmiVersionType", inference_ami_version)
    ours = {t["Key"]: t["Value"] for t in tags}
    steps = (
        (
            "model",
            model_name,
            lambda: sm.create_model(
                ModelName=model_name,
                PrimaryContainer=container,
                ExecutionRoleArn=role_arn,
                Tags=tags,
                # No outbound network from the container: it serves the validated copy SageMaker puts in
                # /opt/ml/model, never a model a config names on the Hub (the stack's role requires it).
                EnableNetworkIsolation=True,
            ),
            lambda: sm.describe_model(ModelName=model_name)["ModelArn"],
        ),
        (
            "endpoint-config",
            config_name,
            lambda: (
                sm.create_endpoint_config(
                    EndpointConfigName=config_name, ProductionVariants=[variant], Tags=tags, ExecutionRoleArn=role_arn
                )
                if for_components
                else sm.create_endpoint_config(EndpointConfigName=config_name, ProductionVariants=[variant], Tags=tags)
            ),
            lambda: sm.describe_endpoint_config(EndpointConfigName=config_name)["EndpointConfigArn"],
        ),
        (
            "endpoint",
            name,
            lambda: sm.create_endpoint(EndpointName=name, EndpointConfigName=config_name, Tags=tags),
            lambda: sm.describe_endpoint(EndpointName=name)["EndpointArn"],
        ),
    )
    adopted: list[str] = []
    for kind, label, create, arn_of in steps:
        try:
            create()
        except ClientError as exc:
            if not _already_exists(exc):
                _raise_domain(exc, f"creating {kind}/{label}")
                raise
            try:
                theirs = list_tags(sm, arn_of())
            except ClientError as describe_exc:
                _raise_domain(describe_exc, f"describing {kind}/{label}")
                raise
            if any(theirs.get(key) != ours[key] for key in (MANAGED_BY_TAG, DEPLOYMENT_TAG)):
                raise ResourceNameTaken(
                    f"{kind}/{label} already exists and belongs to another deployment "
                    f"({theirs.get(DEPLOYMENT_TAG) or 'not managed by modeldrop'})",
                ) from None
            adopted.append(f"{kind}/{label}")
    return adopted


def _already_exists(exc: ClientError) -> bool:
    message = str(exc.response.get("Error", {}).get("Message", ""))
    return _code(exc) == "ValidationException" and "Cannot create already existing" in message


def describe_endpoint(sm: SageMakerClient, name: str) -> DescribeEndpointOutputTypeDef | None:
    try:
        return sm.describe_endpoint(EndpointName=name)
    except ClientError as exc:
        if _is_missing(exc):
            return None
        _raise_domain(exc, f"describing {name}")
        raise


def delete_all(
    sm: SageMakerClient, endpoint: str | None, config: str | None, model: str | None, owner: str | None = None
) -> tuple[list[str], list[str], list[str], list[str]]:
    """Delete endpoint -> endpoint config -> model (a None name is skipped). Returns
    (deleted, already_gone, failed, not_ours).

    With ``owner`` (a deployment id) a resource tagged for another deployment, or not tagged by
    modeldrop at all, is left alone: a name clash must never delete someone else's endpoint.
    """
    deleted: list[str] = []
    gone: list[str] = []
    failed: list[str] = []
    not_ours: list[str] = []
    steps = (
        (
            "endpoint",
            endpoint,
            # Called only when there is an endpoint (name None is skipped below).
            lambda: sm.delete_endpoint(EndpointName=endpoint or ""),
            lambda: sm.describe_endpoint(EndpointName=endpoint or "")["EndpointArn"],
        ),
        (
            "endpoint-config",
            config,
            lambda: sm.delete_endpoint_config(EndpointConfigName=config or ""),
            lambda: sm.describe_endpoint_config(EndpointConfigName=config or "")["EndpointConfigArn"],
        ),
        (
            "model",
            model,
            lambda: sm.delete_model(ModelName=model or ""),
            lambda: sm.describe_model(ModelName=model or "")["ModelArn"],
        ),
    )
    for kind, name, call, arn_of in steps:
        if name is None:
            continue
        label = f"{kind}/{name}"
        try:
            if owner is not None and list_tags(sm, arn_of()).get(DEPLOYMENT_TAG) != owner:
                not_ours.append(label)
                continue
            call()
            deleted.append(label)
        except ClientError as exc:
            if _is_missing(exc):
                gone.append(label)
            else:
                _raise_domain(exc, f"deleting {label}")
                failed.append(f"{label}: {exc.response.get('Error', {}).get('Message', exc)}")
                if kind == "endpoint":
                    # A live endpoint still needs its config and model: leave both for the retry or
                    # the reaper rather than strand a billing endpoint without them.
                    break
    return deleted, gone, failed, not_ours


def list_tags(sm: SageMakerClient, arn: str) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in all_items(sm, "list_tags", "Tags", ResourceArn=arn)}


def list_endpoints(sm: SageMakerClient) -> list[dict[str, Any]]:
    return all_items(sm, "list_endpoints", "Endpoints", page_size=100)


def endpoint_container_env(sm: SageMakerClient, endpoint_name: str) -> tuple[str, dict[str, str]] | None:
    """(status, the primary container's env) of an endpoint; None when it does not exist."""
    desc = describe_endpoint(sm, endpoint_name)
    if desc is None:
        return None
    config = sm.describe_endpoint_config(EndpointConfigName=desc["EndpointConfigName"])
    model_name = config["ProductionVariants"][0].get("ModelName")
    env: dict[str, str] = {}
    if model_name:
        model = sm.describe_model(ModelName=model_name)
        container = model.get("PrimaryContainer") or (model.get("Containers") or [{}])[0]
        env = dict(container.get("Environment") or {})
    return str(desc.get("EndpointStatus")), env
