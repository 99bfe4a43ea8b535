"""Which engine, at which version, a checkpoint is judged for: rules the engines enforce differently
by version (KV-shared tensors, LoRA features) are applied for the engine of the image that will serve."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

EngineName = Literal["vllm", "sglang", "lmi"]


@dataclass(frozen=True)
class EngineVersion:
    engine: EngineName
    version: str  # the version of the engine's parser and loader (vLLM's for LMI, which bundles it)
    source: str  # how it was found

    def at_least(self, version: str) -> bool:
        return _key(self.version) >= _key(version)

    @property
    def runs_vllm(self) -> bool:
        return self.engine in ("vllm", "lmi")

    def describe(self) -> str:
        engine = {"vllm": "vLLM", "sglang": "SGLang", "lmi": "LMI (vLLM inside)"}[self.engine]
        return f"{engine} {self.version} ({self.source})"


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split(".") if p.isdigit())
