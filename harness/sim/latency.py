"""How long the simulated server takes: prefill of uncached tokens, decode slowed by batch.

Defaults (``speed=1``): a turn with ~3k new prompt tokens and ~150 output tokens at 80
requests in flight takes about 1.4 s; an 80k-token prompt with nothing cached needs ~1.6 s
before its first token. ``speed`` divides every delay.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Latency:
    speed: float = 1.0
    base_ttft: float = 0.02  # scheduling and the first decode step, seconds
    prefill_tokens_per_s: float = 50_000.0
    decode_base: float = 0.002  # seconds per output token with one request running
    decode_per_running: float = 0.00008  # extra seconds per token per running request

    def ttft(self, uncached_tokens: int) -> float:
        return (self.base_ttft + max(uncached_tokens, 0) / self.prefill_tokens_per_s) / self.speed

    def per_token(self, running: int) -> float:
        return (self.decode_base + self.decode_per_running * max(running, 1)) / self.speed
