"""The knobs of the embedded endpoint, as one frozen value."""

from __future__ import annotations

from dataclasses import dataclass

from harness.errors import UsageError

INDEX_K = ("bf16", "fp8")
HICACHE = ("on", "off")
TOPK = ("v1", "v2")
FAULT_KINDS = ("salad", "envelope", "json", "schema", "repetition", "debris")

DEFAULT_MODEL = "deepseek-ai/DeepSeek-V4-Flash"


@dataclass(frozen=True)
class SimConfig:
    """Everything that shapes the simulated server.

    ``index_k``, ``hicache`` and ``topk`` are the incident's knobs (defaults: the production
    setting); ``topk`` has no effect by design. ``speed`` divides every delay.
    ``fault_scale`` multiplies the corruption probability and ``force_fault`` injects one kind
    in every chat response: both exist for tests and calibration.
    """

    index_k: str = "bf16"
    hicache: str = "on"
    topk: str = "v2"
    speed: float = 1.0
    seed: int = 0
    model: str = DEFAULT_MODEL
    kv_capacity: int = 50_000_000
    chunk_tokens: int = 4
    max_running: int = 256
    fault_scale: float = 1.0
    force_fault: str | None = None
    default_max_tokens: int = 4096

    def __post_init__(self) -> None:
        for name, value, allowed in (
            ("index_k", self.index_k, INDEX_K),
            ("hicache", self.hicache, HICACHE),
            ("topk", self.topk, TOPK),
        ):
            if value not in allowed:
                raise UsageError(f"{name} must be one of {', '.join(allowed)}, not {value!r}")
        if self.force_fault is not None and self.force_fault not in FAULT_KINDS:
            raise UsageError(
                f"force_fault must be one of {', '.join(FAULT_KINDS)}, not {self.force_fault!r}"
            )
        if not self.speed > 0:
            raise UsageError(f"speed must be a positive number, not {self.speed}")
        if self.fault_scale < 0:
            raise UsageError(f"fault_scale must be zero or more, not {self.fault_scale}")
        for name, number in (
            ("kv_capacity", self.kv_capacity),
            ("chunk_tokens", self.chunk_tokens),
            ("max_running", self.max_running),
            ("default_max_tokens", self.default_max_tokens),
        ):
            if number < 1:
                raise UsageError(f"{name} must be at least 1, not {number}")
