"""The validation report: what `validate` prints with --json and the pipeline stores beside a deployment."""

from __future__ import annotations

from pydantic import BaseModel, Field

from modeldrop.checkpoint.adapters.adapter_rules import AdapterSummary
from modeldrop.checkpoint.chat.chat_contract import ChatContract
from modeldrop.checkpoint.engine.engine_check import EngineCheck
from modeldrop.checkpoint.weights.base_compare import BaseComparison
from modeldrop.contracts.models import Finding, ValidationSummary


class KvShared(BaseModel):
    num_hidden_layers: int | None = None
    num_kv_shared_layers: int = 0
    expected_tensors: int = 0
    missing: list[str] = Field(default_factory=list)


class ValidationReport(BaseModel):
    deployable: bool
    source: str
    format: str
    architecture: str | None
    model_type: str | None
    tensor_count: int
    shard_count: int
    total_bytes: int
    weights_bytes: int
    weights_gib: float
    parameters: int
    dtypes: dict[str, int]
    vocab_size: int | None
    num_hidden_layers: int | None
    max_position_embeddings: int | None
    torch_dtype: str | None
    layer_types: list[str] | None = None
    sliding_window: int | None = None
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    kv_latent: bool = False
    judged_for: str | None = None  # the engine and version the engine-dependent rules were applied for
    kv_per_layer: list[list[int]] | None = None
    # A hybrid's recurrent layers (named in layer_types) keep this state per running sequence instead of KV.
    recurrent_state_bytes_per_sequence: int = 0
    has_tokenizer: bool
    has_chat_template: bool
    has_generation_config: bool
    kv_shared: KvShared
    findings: list[Finding]
    base: BaseComparison | None = None
    requests: int = 0
    # Media the model takes besides text (its config has a vision_config / audio_config).
    modalities: list[str] = Field(default_factory=list)
    # A LoRA adapter's own facts (its config, ranks, size), judged against the base named.
    adapter: AdapterSummary | None = None
    # What the model's chat behaviour rests on (EOS ids, template, end-of-turn token), when it has a tokenizer.
    chat_contract: ChatContract | None = None
    # The engine's own verdict (validate --engine-check): its engine, version, verdict and message.
    engine_check: EngineCheck | None = None

    def summary(self, report_uri: str | None = None) -> ValidationSummary:
        """The state-sized part: every ValidationSummary field this report shares, plus the few it derives."""
        shared = self.model_dump(include=set(ValidationSummary.model_fields) & set(type(self).model_fields))
        shared["findings"] = [f for f in self.findings if f.severity != "info"][:20]
        return ValidationSummary(
            **shared, num_kv_shared_layers=self.kv_shared.num_kv_shared_layers, report_uri=report_uri
        )
