"""Pydantic models of the deployment request and of every state payload.

The request's JSON Schema (schemas/deployment-request.schema.json) is generated from
DeploymentRequest; tests fail when the published file is stale.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from modeldrop.contracts.artifact import ArtifactUri
from modeldrop.contracts.channel import CHANNEL_PATTERN, IdleRequest
from modeldrop.contracts.env_safety import env_json_schema, env_problem
from modeldrop.contracts.instance_types import instance_type_problem
from modeldrop.contracts.s3uri import S3_URI_PATTERN, parse_s3_uri
from modeldrop.contracts.served import AdapterInfo
from modeldrop.contracts.step_payloads import AttachedBase, Engine

# Instance types one deployment tries at most: with the poll, quota and teardown loops' own bounds,
# an execution's history stays within Step Functions' 25,000 events (a contract test adds it up).
MAX_INSTANCE_TYPES = 6
# adapter_mode shared: adapter inference components one deployment puts on its base endpoint.
MAX_SHARED_ADAPTERS = 16
INSTANCE_TYPE_PATTERN = r"^ml\.[a-z0-9]+\.[a-z0-9]+$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ChatMessage(_Strict):
    role: Literal["system", "user", "assistant"]
    content: str


class EvalThresholds(_Strict):
    """How many eval cases may be truncated or error before the deployment fails."""

    max_truncated: Annotated[int, Field(ge=0)] = 0
    max_errors: Annotated[int, Field(ge=0)] = 0
    max_check_failures: Annotated[int, Field(ge=0)] = 0


class GateThresholds(_Strict):
    """How much a candidate may regress against the champion and still be promoted."""

    max_regressed_cases: Annotated[int, Field(ge=0, le=1000)] = Field(
        default=0, description="cases that may regress (any kind) before promotion is blocked"
    )
    max_length_ratio: Annotated[float, Field(ge=1, le=100)] = Field(
        default=3.0, description="an answer longer or shorter than the champion's by more than this factor regresses"
    )
    max_ttft_ratio: Annotated[float, Field(ge=1, le=100)] = Field(
        default=2.0, description="time to first token over this multiple of the champion's (past the slack) regresses"
    )
    min_tokens_per_s_ratio: Annotated[float, Field(gt=0, le=1)] = Field(
        default=0.5, description="a generation rate under this fraction of the champion's regresses"
    )
    latency_slack_s: Annotated[float, Field(ge=0, le=60)] = Field(
        default=0.25, description="latency differences under this many seconds are noise"
    )

    def looser_than(self, other: GateThresholds) -> list[str]:
        """The thresholds on which this gate lets through more than OTHER does (the latency slack, noise
        in seconds, is bounded by the stack's MaxGateLatencySlack instead)."""
        looser = [n for n in ("max_regressed_cases", "max_length_ratio", "max_ttft_ratio") if getattr(self, n) >
                  getattr(other, n)]  # fmt: skip
        return looser + (
            ["min_tokens_per_s_ratio"] if self.min_tokens_per_s_ratio < other.min_tokens_per_s_ratio else []
        )


class SpeculativeDecoding(_Strict):
    """EAGLE3 speculative decoding (vLLM and LMI): a draft head trained for the target model proposes
    tokens the target verifies in one pass. Off unless given; there is no default head."""

    method: Literal["eagle3"] = "eagle3"
    model: Annotated[str, Field(min_length=1, max_length=512)] = Field(
        description="the draft head: a Hugging Face id, or a directory inside the artifact (e.g. ./eagle3-head)"
    )
    num_speculative_tokens: Annotated[int, Field(ge=1, le=16)] = 3
    parallel_drafting: bool = Field(False, description="P-EAGLE: needs a head trained for parallel drafting")


class EngineSettings(_Strict):
    """The engine settings users know from `vllm serve`, checked by the plan (unlike raw engine_env)."""

    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] | None = Field(
        default=None, description="fraction of each GPU's memory the engine may use (the plan's budget); default 0.90"
    )
    tensor_parallel_size: Annotated[int, Field(ge=1, le=64)] | None = Field(
        default=None, description="GPUs per replica; must divide the instance's GPU count (default: all of them)"
    )
    dtype: Literal["auto", "bfloat16", "float16", "float32"] | None = Field(
        default=None, description="weight/activation dtype; the plan sizes the weights at this width"
    )
    quantization: Annotated[str, Field(pattern=r"^[a-z0-9_-]{2,32}$")] | None = Field(
        default=None, description="the engine's quantization method, e.g. fp8, awq, gptq"
    )
    limit_mm_per_prompt: dict[Literal["image", "video", "audio"], Annotated[int, Field(ge=0, le=64)]] | None = Field(
        default=None,
        description='media items per prompt, e.g. {"image": 2}; multimodal checkpoints only (default image 1)',
    )
    speculative: SpeculativeDecoding | None = None
    trust_remote_code: bool | None = Field(
        default=None,
        description=(
            "let the engine import Python code shipped in the checkpoint (auto_map); refused unless the stack's "
            "AllowTrustRemoteCode permits it"
        ),
    )

    def given(self) -> bool:
        return any(v is not None for v in self.model_dump().values())


class DeploymentRequest(_Strict):
    """What a training pipeline (or the S3 starter) asks modeldrop to deploy."""

    artifact_uri: ArtifactUri = Field(
        description="s3://bucket/key/model.tar.gz, or s3://bucket/prefix/ holding safetensors shards",
    )
    engine: Engine | None = Field(None, description="Serving container; stack default if omitted")
    instance_type: Annotated[str, Field(pattern=INSTANCE_TYPE_PATTERN)] | None = Field(
        None, description="e.g. ml.g6.2xlarge; stack default if omitted"
    )
    instance_types: (
        Annotated[
            list[Annotated[str, Field(pattern=INSTANCE_TYPE_PATTERN)]],
            Field(min_length=1, max_length=MAX_INSTANCE_TYPES, json_schema_extra={"uniqueItems": True}),
        ]
        | Literal["auto"]
        | None
    ) = Field(
        None,
        description=(
            "Instance types to try in order when one has no capacity (or no quota), at most 6; 'auto' = "
            "instance_type (or the stack default) first, then the catalog types whose memory plan fits, cheapest "
            "first, up to 6 in all"
        ),
    )
    max_hourly_price: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = Field(
        None, description="USD per instance-hour: types priced above it are never tried"
    )
    endpoint_name: Annotated[str, Field(pattern=r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,58}$")] | None = Field(
        default=None,
        description=(
            "The SageMaker endpoint's name (at most 59 characters, leaving room for a fallback attempt's "
            "'-aN'); it must start with the stack's resource prefix and a dash, the only names the stack's roles "
            "and reaper act on. Default: <prefix>-<deployment id>"
        ),
    )
    instance_count: Annotated[int, Field(ge=1, le=100)] = Field(
        1,
        description=(
            "SageMaker's InitialInstanceCount: instances behind the endpoint, each holding the whole model (the "
            "memory plan is per instance); the quota check and the cost count every one"
        ),
    )
    quota_wait_minutes: Annotated[float, Field(ge=0, le=24 * 60)] = Field(
        0, description="How long to wait for a type at its endpoint quota before moving on (0: do not wait)"
    )
    capacity_wait_minutes: Annotated[float, Field(ge=5, le=240)] = Field(
        30,
        description=(
            "An endpoint still Creating with no instance (never modified, no log group) after this long is a "
            "capacity failure"
        ),
    )
    ttl_hours: Annotated[float, Field(gt=0, le=24 * 14)] | None = Field(
        None, description="Hours until the reaper deletes the endpoint; stack default if omitted"
    )
    eval_set_uri: str | None = Field(
        None, description="s3:// URI of a JSONL eval set", json_schema_extra={"pattern": S3_URI_PATTERN}
    )
    base: ArtifactUri | None = Field(
        None,
        description=(
            "With a LoRA adapter as artifact_uri (adapter_config.json + adapter_model.safetensors): the base "
            "checkpoint it is served on, s3://bucket/key.tar.gz or s3://bucket/prefix/. The adapter is validated "
            "against it before any endpoint exists"
        ),
    )
    adapter_mode: Literal["dedicated", "shared"] | None = Field(
        None,
        description=(
            "How an adapter is served: dedicated (one endpoint holding the base and the adapter; the default on "
            "LMI and SGLang, refused on vLLM, whose /invocations would answer with the base) or shared (adapter "
            "inference components on one base endpoint; the default on vLLM)"
        ),
    )
    base_endpoint: Annotated[str, Field(pattern=r"^[a-zA-Z0-9][a-zA-Z0-9-]{0,62}$")] | None = Field(
        None,
        description=(
            "adapter_mode shared, instead of base: a live shared deployment (its deployment id or endpoint name) "
            "whose base endpoint takes these adapters as further adapter inference components; they are "
            "validated against its base, and torn down (or expire) on their own while the base serves on"
        ),
    )
    adapters: Annotated[list[ArtifactUri], Field(max_length=MAX_SHARED_ADAPTERS - 1)] | None = Field(
        None,
        description=(
            "adapter_mode shared only: further LoRA adapters served on the same base endpoint beside artifact_uri, "
            "each as its own adapter inference component, named by its folder (or archive)"
        ),
    )
    max_model_len: Annotated[int, Field(ge=256, le=1_048_576)] | None = None
    max_num_seqs: Annotated[int, Field(ge=1, le=1024)] | None = None
    eval_thresholds: EvalThresholds = Field(default_factory=EvalThresholds)
    channel: Annotated[str, Field(pattern=CHANNEL_PATTERN)] | None = Field(
        None,
        description=(
            "A model line's stable endpoint (<prefix>-ch-<channel>): once InService and evaluated, this deployment "
            "creates the channel, or is gated against the version serving it and promoted when nothing regresses "
            "(an adapter on the channel's base: by switching components, no endpoint created)"
        ),
    )
    gate: GateThresholds = Field(
        default_factory=GateThresholds,
        description="With channel: how much the candidate may regress against the serving version (stack-limited)",
    )
    idle: IdleRequest | None = Field(
        None,
        description=(
            "With channel, when it is created: scale the channel to zero after this long without an invocation "
            "(an endpoint of inference components with managed instance scaling; always-on where the region "
            "refuses it, the plan saying why); invocations while it sleeps wake it"
        ),
    )
    promotion_grace_hours: Annotated[float, Field(ge=0, le=336)] = Field(
        1.0, description="With channel: how long the version this one replaces is kept for a rollback"
    )
    engine_settings: EngineSettings = Field(
        default_factory=EngineSettings,
        description="Named, plan-checked engine settings (memory fraction, TP, dtype, quantization, media, EAGLE3)",
    )
    engine_env: dict[str, str] = Field(
        default_factory=dict,
        description="Expert passthrough of raw container env keys; each must carry the engine's own prefix",
        json_schema_extra=env_json_schema(),
    )
    secrets: dict[str, str] = Field(
        default_factory=dict,
        description=(
            "Container env names -> secret references (secretsmanager:<name>[#key] or ssm:<name>) under the "
            "stack's secrets prefix; values are read when the model is created and never stored or logged"
        ),
    )
    force_plan: bool = Field(False, description="Deploy even when the memory plan predicts a CUDA OOM")
    source: Literal["direct", "s3-event"] = "direct"

    # Whether a type exists in SageMaker and has a GPU is botocore's list, which changes with its version:
    # NormalizeRequest asks it (instance_type_problems), not the grammar the published schema states.
    @field_validator("instance_types")
    @classmethod
    def _instance_types(cls, value: list[str] | str | None) -> list[str] | str | None:
        if isinstance(value, list) and len(set(value)) != len(value):
            raise ValueError("instance_types names a type twice")
        return value

    @field_validator("eval_set_uri")
    @classmethod
    def _eval_set(cls, value: str | None) -> str | None:
        if value is not None:
            parse_s3_uri(value)
        return value

    @field_validator("engine_env")
    @classmethod
    def _engine_env(cls, value: dict[str, str]) -> dict[str, str]:
        for key, item in value.items():
            problem = env_problem(key, item)
            if problem:
                raise ValueError(problem)
        return value


def instance_type_problems(request: DeploymentRequest) -> list[str]:
    """Each named instance type SageMaker does not host, or that has no GPU, with its fix."""
    names = [request.instance_type] if request.instance_type else []
    names += request.instance_types if isinstance(request.instance_types, list) else []
    return [f"{p[0]}; {p[1]}" for name in names if (p := instance_type_problem(name))]


# The request nests four levels at most: deeper than this is refused by the model whatever it holds,
# and a direct start's 256 KB input could otherwise nest deep enough to exhaust the recursion.
_MAX_DEPTH = 16


def _integral(value: Any, depth: int = 0) -> Any:
    """JSON's numbers as JSON Schema reads them: 2.0 is the integer 2 (RFC 8259 has one number type)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if depth >= _MAX_DEPTH:
        return None if isinstance(value, dict | list) else value  # the model refuses a null there
    if isinstance(value, dict):
        return {k: _integral(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [_integral(v, depth + 1) for v in value]
    return value


def parse_request(raw: Any) -> DeploymentRequest:
    """A request read from JSON (a direct start's input, a marker's overrides) exactly as its published
    schema states it: no string taken for a number, no number for a boolean (pydantic's lax coercions
    would accept what the schema refuses). Raises pydantic's ValidationError."""
    return DeploymentRequest.model_validate(_integral(raw), strict=True)


class NamedAdapter(BaseModel):
    uri: ArtifactUri
    name: str
    version: str | None = None  # pinned at registration


class NormalizedRequest(DeploymentRequest):
    """The request with every default applied and the names of what it will create.

    Every field of the request is carried as it was given; only the ones redefined here change
    (a default applied, a list made explicit), so a new request field needs no code here.
    """

    deployment_id: str
    execution_name: str
    # The execution that owns the deployment: every write to its record is conditioned on it.
    execution_arn: str
    engine: Engine
    instance_type: str
    ttl_hours: float
    instance_types: list[str] | None = None  # None: only instance_type; ["auto"] expands after validation
    resource_name: str
    deploy_deadline_seconds: int
    quota_wait_seconds: int = 0
    capacity_wait_seconds: int = 1800
    # The stack's allowed instance type patterns: a fallback ("auto") tries nothing else.
    allowed_instance_types: list[str] = Field(default_factory=list)
    # An adapter deployment: artifact_uri is the base (what is served and planned), the adapter rides along.
    adapter_uri: ArtifactUri | None = None
    adapter_name: str | None = None
    # adapter_mode shared: the adapters after the first, each an adapter inference component.
    more_adapters: list[NamedAdapter] = Field(default_factory=list)

    @field_validator("instance_types")
    @classmethod
    def _instance_types(cls, value: list[str] | str | None) -> list[str] | str | None:
        return value  # the request's list, checked where it was read, with the first type (or "auto") in front


_SLUG = re.compile(r"[^a-z0-9-]+")
# The id goes into SageMaker names (<prefix>-<id>, at most 63 characters with a 20-character prefix).
ID_SLUG_CHARS = 31
ID_HASH_CHARS = 10


def deployment_id_for(execution_name: str, started_ms: int) -> str:
    """The deployment's id: a readable slug of the execution's name and a hash of the name and its
    start time. Unique per execution: two names never share an id (the hash covers the whole name,
    so a name that looks like another's id is no clash), and neither does a name reused after Step
    Functions' 90-day window (its start time differs)."""
    slug = re.sub("-{2,}", "-", _SLUG.sub("-", execution_name.lower())).strip("-")
    digest = hashlib.sha256(f"{execution_name}\n{started_ms}".encode()).hexdigest()[:ID_HASH_CHARS]
    return f"{slug[:ID_SLUG_CHARS].strip('-') or 'd'}-{digest}"


def epoch_ms(value: str | int | float | datetime) -> int:
    """An execution's start as whole milliseconds since the epoch, from whatever form carries it: the
    context object's ISO time (milliseconds on AWS, microseconds in moto), describe_execution's
    datetime, or the status-change event's epoch milliseconds. Floored, never rounded through a float."""
    if isinstance(value, bool):
        raise ValueError("a start time is not a boolean")
    if isinstance(value, int | float):
        return int(value)
    moment = value if isinstance(value, datetime) else datetime.fromisoformat(value.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return (moment - _EPOCH) // timedelta(milliseconds=1)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def deployment_id_of(execution: Mapping[str, Any]) -> str:
    """The deployment id of an execution as describe_execution, list_executions or its status-change
    event gives it (a name and a start date)."""
    return deployment_id_for(str(execution["name"]), epoch_ms(execution["startDate"]))


def resource_name_for(prefix: str, deployment_id: str) -> str:
    name = f"{prefix}-{deployment_id}"
    if len(name) > 63:
        raise ValueError(f"resource name {name!r} exceeds SageMaker's 63 characters")
    return name


class Finding(BaseModel):
    code: str
    severity: Literal["error", "warning", "info"]
    message: str
    hint: str = ""


class ValidationSummary(BaseModel):
    """The part of the validation report that travels in the state payload."""

    deployable: bool
    format: str
    architecture: str | None
    model_type: str | None
    tensor_count: int
    shard_count: int
    total_bytes: int
    weights_gib: float
    parameters: int
    vocab_size: int | None
    num_hidden_layers: int | None
    max_position_embeddings: int | None
    num_kv_shared_layers: int = 0
    num_key_value_heads: int | None = None  # as the engines derive it (heads when the config names none)
    head_dim: int | None = None  # as the engines derive it (hidden_size / heads when the config names none)
    kv_latent: bool = False  # MLA: one latent of head_dim per token and layer instead of a K and a V
    kv_per_layer: list[list[int]] | None = None  # [kv_heads, head_dim] per layer, where layers differ
    layer_types: list[str] | None = None
    sliding_window: int | None = None
    # A hybrid's Mamba / linear-attention / short-conv state per running sequence (its layers cache no KV).
    recurrent_state_bytes_per_sequence: int = 0
    has_chat_template: bool
    findings: list[Finding]
    report_uri: str | None = None
    # The pinned source version and the immutable copy of it that SageMaker is given.
    artifact_version: str | None = None
    served_uri: ArtifactUri | None = None
    served_digest: str | None = None  # what the served copy was when validated (checked before CreateModel)
    modalities: list[str] = Field(default_factory=list)
    dtypes: dict[str, int] = Field(default_factory=dict)  # bytes per dtype: what a dtype setting rescales
    adapter: AdapterInfo | None = None  # the LoRA adapter served with the base, validated against it
    attached: AttachedBase | None = None  # shared, on another deployment's base endpoint
    more_adapters: list[AdapterInfo] = Field(default_factory=list)  # adapter_mode shared: the others

    @property
    def adapters(self) -> list[AdapterInfo]:
        return [self.adapter, *self.more_adapters] if self.adapter is not None else []
