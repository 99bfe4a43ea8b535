"""Turn a validated checkpoint plus a request into the container env, timeouts and memory plan."""

from __future__ import annotations

from collections.abc import Mapping

from modeldrop.engine_env import MODEL_PATH, build_env
from modeldrop.errors import PlanRefused
from modeldrop.memory_plan import (
    ModelShape,
    largest_fitting_seqs,
    plan_memory,
    smallest_fitting_instance,
)
from modeldrop.models import Engine, EnginePlan

DEFAULT_MAX_NUM_SEQS = 32  # vLLM's 256 OOMs a 24 GB GPU through the sampler buffer
DEFAULT_FRACTION = 0.90
DEFAULT_MAX_MODEL_LEN_CAP = 8192
INVOCATION_CAP_SECONDS = 60.0
MS_PER_TOKEN = {"vllm": 40.0, "sglang": 40.0, "lmi": 45.0}  # L4-class, measured in the seed for vLLM


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


def plan_serving(
    engine: Engine,
    shape: ModelShape,
    instance_type: str,
    region: str,
    max_num_seqs: int | None = None,
    max_model_len: int | None = None,
    max_position_embeddings: int | None = None,
    passthrough: Mapping[str, str] | None = None,
) -> EnginePlan:
    seqs = max_num_seqs or DEFAULT_MAX_NUM_SEQS
    model_len = max_model_len or min(max_position_embeddings or DEFAULT_MAX_MODEL_LEN_CAP, DEFAULT_MAX_MODEL_LEN_CAP)
    if max_position_embeddings and model_len > max_position_embeddings:
        raise PlanRefused(
            f"max_model_len {model_len} exceeds the model's max_position_embeddings {max_position_embeddings}",
            f"use max_model_len <= {max_position_embeddings}",
        )
    memory: dict[str, object] = {}
    try:
        plan = plan_memory(shape, instance_type, seqs, model_len, DEFAULT_FRACTION)
    except KeyError:
        plan = None
        memory = {"verdict": "unknown", "reason": f"{instance_type} is not in the instance catalog"}
    if plan is not None:
        memory = plan.model_dump()
        if plan.verdict == "oom":
            fitting = largest_fitting_seqs(shape, instance_type, model_len, DEFAULT_FRACTION)
            bigger = smallest_fitting_instance(shape, seqs, model_len, DEFAULT_FRACTION, region)
            options = []
            if fitting:
                options.append(f"max_num_seqs={fitting} fits on {instance_type}")
            if bigger:
                options.append(f"{bigger} fits max_num_seqs={seqs}")
            raise PlanRefused(
                f"predicted CUDA OOM on {instance_type}: budget {plan.budget_gib:.2f} GiB, weights "
                f"{plan.weights_gib:.2f}, sampler {plan.sampler_gib:.2f}, overhead {plan.overhead_gib:.2f}, "
                f"KV needs {plan.kv_min_gib:.2f} but {max(plan.kv_cache_gib, 0):.2f} is left",
                "; ".join(options) or "choose a larger instance type",
            )
    tp = plan.tensor_parallel if plan else 1
    settings: dict[str, object] = {
        "model_path": MODEL_PATH,
        "max_model_len": model_len,
        "max_num_seqs": seqs,
        "gpu_memory_utilization": DEFAULT_FRACTION,
    }
    if engine != "lmi":  # LMI gets OPTION_TENSOR_PARALLEL_DEGREE=max by default
        settings["tensor_parallel_degree"] = tp
    env = build_env(engine, settings, passthrough)
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
    )
