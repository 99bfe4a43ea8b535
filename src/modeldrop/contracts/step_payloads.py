"""Pydantic models of the payloads the states pass on after validation: the image, the plan, the
endpoint (and, shared, its inference components), attempts, polls, the eval's verdict, teardown."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

Engine = Literal["vllm", "sglang", "lmi"]


class ImageChoice(BaseModel):
    engine: Engine
    image_uri: str
    source: str
    region: str
    warnings: list[str] = Field(default_factory=list)


class Candidate(BaseModel):
    """One instance type of the preference list, with the memory plan's verdict on it."""

    instance_type: str
    verdict: str  # fits | tight | oom | unknown | over-price
    hourly_price: float | None = None
    usable: bool = True
    reason: str = ""


class AttachedBase(BaseModel):
    """A live shared deployment whose base endpoint takes another deployment's adapter components."""

    deployment_id: str
    endpoint_name: str
    base_component: str
    model_name: str
    served_uri: str  # its served copy: what the adapters are validated against
    instance_type: str | None = None
    adapters_on_endpoint: int | None = None  # adapter components on it at registration (its LoRA slots taken)


class EnginePlan(BaseModel):
    env: dict[str, str]
    instance_type: str
    max_num_seqs: int
    max_model_len: int | None
    startup_timeout_seconds: int
    download_timeout_seconds: int
    memory: dict[str, Any] = Field(default_factory=dict)
    eval_max_tokens_ceiling: int | None = None
    warnings: list[str] = Field(default_factory=list)
    attempt: int = 0  # index into `candidates` of the type this plan is for
    candidates: list[Candidate] = Field(default_factory=list)
    instance_count: int = 1  # each instance holds the whole model: `memory` is one instance's plan
    # Whether the container downloads anything from the Hugging Face Hub (a draft head by Hub id):
    # only then does a Hub token go into its env.
    hub_download: bool = False
    # The host image whose NVIDIA driver covers the image's CUDA on this instance family (None: the
    # family's default driver), and why.
    inference_ami_version: str | None = None
    host: dict[str, Any] = Field(default_factory=dict)
    attached: AttachedBase | None = None  # adapters added to another deployment's base endpoint


class AdapterComponent(BaseModel):
    component: str  # the adapter inference component's name: what invocations name
    adapter: str  # the adapter's own name
    artifact_url: str  # the validated adapter, packed as SageMaker takes it (.tar.gz)


class ComponentPlan(BaseModel):
    """adapter_mode shared: the base inference component and the adapter components on the endpoint."""

    base: str
    variant: str = "AllTraffic"
    model_name: str
    accelerators: int
    memory_mb: int
    adapters: list[AdapterComponent]
    tags: list[dict[str, str]]
    copies: int = 1  # one copy of the base per instance: every instance serves
    # The plan's timeouts, on the base component itself (AWS's adapter guide and the SDK's ModelBuilder
    # set them there; no document says a component inherits its variant's).
    download_timeout_seconds: int | None = None
    startup_timeout_seconds: int | None = None


class EndpointRef(BaseModel):
    endpoint_name: str
    endpoint_config_name: str
    model_name: str
    deadline_at: str
    instance_type: str | None = None
    attempt: int = 0
    created_at: str | None = None
    # The deadline spread over at most MAX_POLLS polls: the poll loop's Wait is never shorter.
    min_poll_seconds: int = 5
    components: ComponentPlan | None = None  # adapter_mode shared


class CreateOutcome(BaseModel):
    """CreateEndpoint's answer: created, or the type is at its quota (wait `wait_seconds`, or move on)."""

    status: Literal["created", "quota-busy"]
    endpoint: EndpointRef | None = None
    wait_seconds: int = 0
    quota_waits: int = 0
    quota_wait_until: str | None = None
    reason: str = ""


class AttemptStep(BaseModel):
    """NextAttempt's answer: the index of the next instance type to try."""

    attempt: int
    instance_type: str
    failed: dict[str, Any]


class TeardownProgress(BaseModel):
    """One pass of the teardown loop: done, or wait and look again (until `deadline_at`)."""

    done: bool
    gave_up: bool = False
    deadline_at: str
    wait_seconds: int = 15
    deleted: list[str] = Field(default_factory=list)
    already_gone: list[str] = Field(default_factory=list)
    left_behind: list[str] = Field(default_factory=list)
    not_ours: list[str] = Field(default_factory=list)
    endpoint_status: str | None = None
    # Endpoints SageMaker would not delete while Creating (no instance, nothing billed): recorded, and
    # deleted by the final teardown or the reaper once they can be.
    stranded: list[str] = Field(default_factory=list)


class EndpointPoll(BaseModel):
    status: str
    polls: int = 0


class EvalVerdict(BaseModel):
    passed: bool
    cases: int
    truncated: int
    errors: int
    check_failures: int
    summary: str
    report_uri: str | None = None
    report_markdown_uri: str | None = None
    ttft_p50_s: float | None = None
    tokens_per_s_p50: float | None = None
    component: str | None = None  # the inference component evaluated (adapter_mode shared)
    fixes: list[str] = Field(default_factory=list)
    components: list[EvalVerdict] = Field(default_factory=list)  # shared: one verdict per adapter component


class FailureRecord(BaseModel):
    error: str
    cause: str
    failure_class: str
    state: str | None = None
    endpoint_failure_reason: str | None = None
    log_group: str | None = None
    log_excerpt: list[str] = Field(default_factory=list)
    diagnosis: str | None = None
    hint: str | None = None
    phase: str = "endpoint"  # "prepare": failed before any SageMaker resource existed


class TeardownResult(BaseModel):
    deleted: list[str]
    already_gone: list[str]
    left_behind: list[str]
    # Same name, another deployment's (or nobody's) tags: never deleted by this deployment.
    not_ours: list[str] = Field(default_factory=list)
