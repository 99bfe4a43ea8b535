"""The engine's own verdict on a checkpoint directory, run in the engine's interpreter (the project's
vLLM venv: `python engine_probe.py DIR [DIR ...]`), one JSON line per directory. Standard library, torch
and vLLM only: it is run as a file, never imported by modeldrop.

What it asks vLLM's own code, no weight byte read and no GPU:
- `EngineArgs(...).create_engine_config()`: ModelConfig's architecture resolution, quantization
  verification, rope and config validation (stage "config");
- the model class built on the meta device, as vLLM's loader builds it (stage "build");
- the model's own `load_weights`, fed empty meta tensors shaped and typed as the safetensors headers say,
  from the files vLLM would read (root `*.safetensors`, filtered by the index) (stage "load");
- the loader's "weights not initialized from checkpoint" check, and, stricter, every parameter the
  model has that no tensor loaded (`strict_not_loaded`: vLLM exempts unquantized linear layers, and
  would serve uninitialised memory for them) (stage "check").
An exception at a stage is the engine's refusal, with its own message; the last frame names a bare
assertion. Known CPU-only limits (the CPU attention backend, a quantization method's CPU kernels) are
said as such: they are not the GPU's verdict.
"""

import inspect
import json
import os
import resource
import socket
import struct
import sys
import time
import traceback
from collections.abc import Iterator
from typing import Any

# A refusal that comes from running on this CPU, not from the checkpoint.
CPU_ONLY = ("not supported on cpu", "cpu backend", "for cpu", "on the cpu", "cpu platform", "head size",
            "failed to find a kernel", "supported only for cuda", "current device cpu")  # fmt: skip
# Parameters the engine sets itself when a checkpoint has none: the attention layer's KV-cache and
# activation scales (1.0 unless an FP8 KV cache's calibration supplies them) and, for compressed-tensors, their
# zero points (zeros: "not used in vLLM", created so that llm-compressor checkpoints holding them load).
ENGINE_DEFAULTED = (".attn.k_scale", ".attn.v_scale", ".attn.q_scale", ".attn.prob_scale", ".attn.k_zero_point",
                    ".attn.v_zero_point", ".attn.q_zero_point")  # fmt: skip
# A model whose load_weights reads the tensors' values (Phi's copies them): meta tensors have none, so the
# probe cannot judge it, which says nothing of the checkpoint.
PROBE_ONLY = ("meta tensor", "on the meta device", "device='meta'")


def _message(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}" if str(exc) else ""
    if not text:
        frame = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
        text = f"{type(exc).__name__} in {frame.name} ({os.path.basename(frame.filename)})" if frame else repr(exc)
    return text[:3000]


def _dtypes() -> dict[str, Any]:
    import torch

    return {
        "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
        "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
        "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
    }  # fmt: skip


def _shards(model_dir: str) -> list[str]:
    files = sorted(f for f in os.listdir(model_dir) if f.endswith(".safetensors") and not f.startswith("."))
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as fh:
            wanted = set(json.load(fh).get("weight_map", {}).values())
        files = [f for f in files if f in wanted]
    return [os.path.join(model_dir, f) for f in files if os.path.isfile(os.path.join(model_dir, f))]


def _meta_weights(model_dir: str) -> Iterator[tuple[str, Any]]:
    import torch

    dtypes = _dtypes()
    for path in _shards(model_dir):
        with open(path, "rb") as fh:
            size = struct.unpack("<Q", fh.read(8))[0]
            header = json.loads(fh.read(size))
        for name, info in header.items():
            if name != "__metadata__":
                yield name, torch.empty(info["shape"], dtype=dtypes.get(info["dtype"], torch.float32), device="meta")


# The probe's own context: small, since nothing is allocated. Never reported as the checkpoint's fault:
# a model whose files declare a shorter one is judged at the context it declares.
PROBE_MAX_MODEL_LEN = 256


def _engine_config(engine_args: Any, model_dir: str) -> Any:
    try:
        return engine_args(
            model=model_dir, enforce_eager=True, max_model_len=PROBE_MAX_MODEL_LEN
        ).create_engine_config()
    except Exception as exc:
        if "max_model_len" not in str(exc) and "max-model-len" not in str(exc):
            raise
    return engine_args(model=model_dir, enforce_eager=True).create_engine_config()


def judge(model_dir: str, started: float) -> dict[str, Any]:
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.engine.arg_utils import EngineArgs

    quantization = None

    def verdict(kind: str, stage: str, message: str = "", **extra: Any) -> dict[str, Any]:
        return {"directory": model_dir, "verdict": kind, "stage": stage, "message": message,
                "seconds": round(time.time() - started, 2), "quantization": quantization, **extra}  # fmt: skip

    try:
        config = _engine_config(EngineArgs, model_dir)
    except Exception as exc:
        return verdict("refused", "config", _message(exc))
    quantization = config.model_config.quantization
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader
    from vllm.model_executor.model_loader.utils import initialize_model

    with set_current_vllm_config(config):
        try:
            with torch.device("meta"):
                model = initialize_model(vllm_config=config)
            model = model.to("meta")  # a few models create parameters on a real device
        except Exception as exc:
            text = _message(exc)
            # A CPU-only limit, or a model whose constructor copies values (Apertus, Bloom: "Cannot copy out of
            # meta tensor"): the probe cannot build it on the meta device, which says nothing of the checkpoint.
            unjudged = any(marker in text.lower() for marker in (*CPU_ONLY, *PROBE_ONLY))
            return verdict("undetermined" if unjudged else "refused", "build", text)
        cache = _cache_layout(config)
        writes = _record_writes(model)
        try:
            loaded = model.load_weights(_meta_weights(model_dir))
        except Exception as exc:
            text = _message(exc)
            probe_only = any(marker in text.lower() for marker in PROBE_ONLY)
            return verdict("undetermined" if probe_only else "refused", "load", text, **cache)
        strict = _never_written(model, writes, set(loaded or ()))
        track = DefaultModelLoader(config.load_config).track_weights_loading
        # 0.32 takes whether the model is quantized (and then exempts less); 0.31 has no such argument.
        asks = {"quantized": quantization is not None} if "quantized" in inspect.signature(track).parameters else {}
        try:  # mutates LOADED: the exemptions the engine makes
            track(model, set(loaded or ()), **asks)
        except Exception as exc:
            return verdict("refused", "check", _message(exc), strict_not_loaded=strict[:50], **cache)
    return verdict("loads", "check", strict_not_loaded=strict[:50], **cache)


def _record_writes(model: Any) -> dict[str, set[tuple[Any, Any]]]:
    """Every parameter's weight loader wrapped to record what it wrote: (shard, expert) per call. The names
    `load_weights` returns are the loader's, which for some layers are not the parameters' (0.31 returns a
    fused MoE's weights as `experts.w13_weight` while the parameter is `experts.routed_experts.w13_weight`):
    what a loader was called on is what was written, under the parameter's own name."""
    import functools

    from vllm.model_executor.model_loader.weight_utils import default_weight_loader

    writes: dict[str, set[tuple[Any, Any]]] = {}
    owners = {f"{prefix}.{leaf}" if prefix else leaf: module for prefix, module in model.named_modules()
              for leaf, _ in module.named_parameters(recurse=False)}  # fmt: skip
    for name, param in model.named_parameters():
        original = getattr(param, "weight_loader", None) or default_weight_loader
        experts = hasattr(owners.get(name), "local_num_experts")

        def recording(*args: Any, _name: str = name, _original: Any = original, _experts: bool = experts,
                      **kwargs: Any) -> Any:  # fmt: skip
            result = _original(*args, **kwargs)
            if result is not False:  # an expert of another rank: not written here
                if _experts:
                    slot = (kwargs.get("shard_id", args[3] if len(args) > 3 else None),
                            kwargs.get("expert_id", args[4] if len(args) > 4 else None))  # fmt: skip
                else:
                    slot = (kwargs.get("loaded_shard_id", args[2] if len(args) > 2 else None), None)
                writes.setdefault(_name, set()).add(slot)
            return result

        try:
            param.weight_loader = functools.wraps(original)(recording)
        except (AttributeError, TypeError):  # a parameter that takes no attribute: its loaded name decides
            continue
    return writes


def _never_written(model: Any, writes: dict[str, set[tuple[Any, Any]]], loaded: set[str]) -> list[str]:
    """Parameters no tensor of the checkpoint wrote -- or wrote only in part: an expert of a fused MoE
    missing a shard the others have, or a fused projection (QKV, gate/up) missing one of its parts. The
    engine serves uninitialised memory there (its own check exempts unquantized layers and sees a fused
    parameter as loaded once any part is). Named as the engine's parameters, a part in brackets."""
    owners = {f"{prefix}.{leaf}" if prefix else leaf: module for prefix, module in model.named_modules()
              for leaf, _ in module.named_parameters(recurse=False)}  # fmt: skip
    missing: list[str] = []
    for name, _ in model.named_parameters():
        slots = writes.get(name)
        if name.endswith(ENGINE_DEFAULTED):
            continue
        if not slots:
            missing += [] if name in loaded else [name]
        elif hasattr(owners.get(name), "local_num_experts") and all(expert is not None for _, expert in slots):
            missing += _expert_gaps(name, int(owners[name].local_num_experts), slots)
        else:
            missing += _part_gaps(name, owners.get(name), slots)
    return sorted(missing)


def _expert_gaps(name: str, experts: int, slots: set[tuple[Any, Any]]) -> list[str]:
    """Each expert of a fused MoE parameter lacking a shard the others have (or every shard)."""
    shards = {shard for shard, _ in slots}
    gaps = []
    for expert in range(experts):
        lacking = sorted(str(s) for s in shards if (s, expert) not in slots)
        if lacking:
            gaps.append(f"{name}[expert {expert}: {', '.join(lacking)}]")
    return gaps


def _part_gaps(name: str, owner: Any, slots: set[tuple[Any, Any]]) -> list[str]:
    """A fused projection's parts no tensor wrote (q/k/v of a QKV, the halves of a gate/up)."""
    written = {s for shard, _ in slots for s in (shard if isinstance(shard, tuple) else (shard,))}
    if None in written:
        return []  # written whole
    kind = type(owner).__name__
    parts: set[Any] = set()
    if kind == "QKVParallelLinear":
        parts = {"q", "k", "v"}
    elif kind == "MergedColumnParallelLinear":
        parts = set(range(len(owner.output_sizes)))
    lacking = sorted(str(p) for p in parts - written)
    return [f"{name}[{', '.join(lacking)}]"] if lacking else []


def _count(shape: Any) -> int:
    total = 1
    for n in shape:
        total *= int(n)
    return total


def _cache_layout(config: Any) -> dict[str, Any]:
    """What the engine's KV cache manager would be asked for, from the built model's own layers
    (get_kv_cache_spec): bytes per token of the attention layers (full, sliding) and the recurrent
    state a hybrid's Mamba / linear-attention layers keep per sequence (unpadded)."""
    try:
        from vllm.v1.kv_cache_interface import AttentionSpec, MambaSpec, SlidingWindowSpec
        from vllm.v1.worker.gpu.attn_utils import get_kv_cache_spec

        full = sliding = state = 0.0
        elements = 0
        for spec in get_kv_cache_spec(config).values():
            if isinstance(spec, MambaSpec):
                state += spec.real_page_size_bytes
                elements += sum(_count(shape) for shape in spec.shapes)
            elif isinstance(spec, SlidingWindowSpec):
                sliding += spec.real_page_size_bytes / spec.block_size
            elif isinstance(spec, AttentionSpec):
                full += spec.real_page_size_bytes / spec.block_size
        # On CPU the SSM state is float32 where the GPU keeps the model's dtype: elements compare across both.
        return {"kv_bytes_per_token": full, "sliding_kv_bytes_per_token": sliding,
                "state_bytes_per_sequence": int(state), "state_elements_per_sequence": elements}  # fmt: skip
    except Exception as exc:  # the layout is extra: a verdict never rests on it
        return {"cache_layout_error": _message(exc)[:300]}


ADAPTER = "--adapter="  # an argument naming a LoRA adapter directory, judged by PEFTHelper


def judge_adapter(adapter_dir: str, started: float) -> dict[str, Any]:
    """A LoRA adapter as vLLM's LoRA manager reads it: PEFTHelper from adapter_config.json, and its
    validate_legal against a LoRAConfig whose max_lora_rank is the smallest vLLM takes that holds the rank."""
    from typing import get_args

    from vllm.config.lora import LoRAConfig, MaxLoRARanks
    from vllm.lora.peft_helper import PEFTHelper

    def verdict(kind: str, message: str = "") -> dict[str, Any]:
        return {"directory": adapter_dir, "verdict": kind, "stage": "peft", "message": message,
                "seconds": round(time.time() - started, 2)}  # fmt: skip

    try:
        helper = PEFTHelper.from_local_dir(adapter_dir, max_position_embeddings=None)
        rank = max([helper.r, *(getattr(helper, "rank_pattern", None) or {}).values()])  # 0.32 reads rank_pattern
        ranks = [r for r in get_args(MaxLoRARanks) if r >= rank] or [max(get_args(MaxLoRARanks))]
        helper.validate_legal(LoRAConfig(max_lora_rank=ranks[0]))
    except Exception as exc:
        return verdict("refused", _message(exc))
    return verdict("loads")


def _gpu_kernels_assumed() -> list[str]:
    """Kernel selection as on a GPU host, not this CPU's: vLLM's CPU FP8 kernels ask for AMX tiles (Sapphire
    Rapids) and refuse the layer without them, which says nothing of the checkpoint. The model is built on
    the meta device and no kernel ever runs, so the probe answers yes; the result lists what it assumed."""
    import importlib

    assumed: list[str] = []
    try:  # vLLM 0.30+; older releases pick the CPU's FP8 kernels elsewhere (and then may say undetermined)
        cpu_kernels = importlib.import_module("vllm.model_executor.kernels.linear.scaled_mm.cpu")
    except ImportError:
        return assumed
    for name, kernel in vars(cpu_kernels).items():
        if isinstance(kernel, type) and kernel.__module__ == cpu_kernels.__name__ and hasattr(kernel, "can_implement"):
            setattr(kernel, "is_supported", classmethod(lambda cls, compute_capability=None: (True, None)))  # noqa: B010
            setattr(kernel, "can_implement", classmethod(lambda cls, config: (True, None)))  # noqa: B010
            assumed.append(name)
    return [f"vLLM's CPU scaled-mm kernels take any layer (AMX tiles, 128-wide blocks): {', '.join(assumed)}"]


def _model_info_in_process() -> None:
    """vLLM inspects a model class it has not cached in a second Python process (to keep CUDA out of its
    parent): on this CPU build, a second import of vLLM -- about 10 CPU-s and 650 MB more -- on every
    container whose cache is cold (every new Lambda container). The probe imports that class itself a
    moment later, so the same inspection runs here, in the engine's own code."""
    from vllm.model_executor.models import registry

    if callable(getattr(registry, "_run_in_subprocess", None)):
        registry._run_in_subprocess = lambda fn: fn()


def _start_engine() -> list[str]:
    """What every judgement needs once a process: vLLM imported, a one-rank process group, the model-info
    inspection in this process, the CPU kernels assumed as a GPU host's."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with set_current_vllm_config(VllmConfig()):
        init_distributed_environment(world_size=1, rank=0, distributed_init_method=f"tcp://127.0.0.1:{port}",
                                     local_rank=0, backend="gloo")  # fmt: skip
        initialize_model_parallel(1, 1)
    _model_info_in_process()
    return _gpu_kernels_assumed()


def _judge_each(dirs: list[str], assumed: list[str]) -> None:
    import vllm

    for model_dir in dirs:
        started = time.time()
        try:
            if model_dir.startswith(ADAPTER):
                result = judge_adapter(model_dir[len(ADAPTER) :], started)
            else:
                result = judge(model_dir, started)
        except MemoryError as exc:  # out of memory is the check dying, not a judgement
            result = {"directory": model_dir, "verdict": "failed", "stage": "probe", "message": _message(exc)}
        except BaseException as exc:  # the probe's own failure: said, never a pass
            result = {"directory": model_dir, "verdict": "undetermined", "stage": "probe", "message": _message(exc)}
        if assumed and result.get("quantization"):
            result["assumed"] = assumed
        result.update(engine="vllm", version=vllm.__version__,
                      peak_rss_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024))  # fmt: skip
        print(json.dumps(result), flush=True)


def main(dirs: list[str]) -> None:
    _judge_each(dirs, _start_engine())


def serve() -> None:
    """A warm engine: vLLM imported once, then each line on stdin (a JSON list of directories) judged as
    `main` judges it, one JSON line per directory. A caller that judges many checkpoints (a warm Lambda
    container) pays the import once, not every check."""
    assumed = _start_engine()
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        _judge_each([str(d) for d in json.loads(line)], assumed)


def _loopback_only() -> None:
    """No connection beyond this machine: the checkpoint is judged alone, whatever a config names (a
    speculators_config's verifier, a processor on the Hub). HF_HUB_OFFLINE asks the libraries; this holds
    whatever asks."""
    import ipaddress

    local_names = {"localhost", socket.gethostname(), None}

    def is_local(host: object) -> bool:
        if not isinstance(host, str) or host in local_names:
            return True
        try:
            address = ipaddress.ip_address(host.split("%", 1)[0])
        except ValueError:
            return False
        return address.is_loopback or address.is_unspecified

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event == "socket.connect" and isinstance(args[1], tuple) and not is_local(args[1][0]):
            raise ConnectionRefusedError(f"the engine check is offline: no connection to {args[1][0]}")
        if event == "socket.getaddrinfo" and not is_local(args[0]):
            raise OSError(f"the engine check is offline: {args[0]} is not looked up")

    sys.addaudithook(hook)


if __name__ == "__main__":  # settings for vLLM before it is imported, never at a mere import of this file
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    _loopback_only()
    if sys.argv[1:] == ["--serve"]:
        serve()
    else:
        main(sys.argv[1:])
