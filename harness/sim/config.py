"""The knobs of the embedded endpoint, as one frozen value."""

from __future__ import annotations

from dataclasses import dataclass, field

from harness.errors import UsageError
from harness.sim.reasoning import REASONING

__all__ = ["REASONING"]
from harness.sim.speaker import speaker

INDEX_K = ("bf16", "fp8")
HICACHE = ("on", "off")
TOPK = ("v1", "v2")
FAULT_KINDS = ("salad", "soup", "envelope", "json", "schema", "repetition", "debris")
#: Transport faults, named like their knobs (``<kind>_rate``); see transport.py.
TRANSPORT_KINDS = ("error", "disconnect", "stall", "error_event", "bad_json", "unencodable")
#: the server's tool-call parser: "on" parses the calls into ``tool_calls``; "off" leaves the
#: model's raw markup in ``content`` (a server whose parser is missing or fails)
TOOL_PARSER = ("on", "off")

DEFAULT_MODEL = "deepseek-ai/DeepSeek-V4-Flash"


@dataclass(frozen=True)
class SimConfig:
    """Everything that shapes the simulated server.

    ``index_k``, ``hicache`` and ``topk`` are the incident's knobs (defaults: the production
    setting); ``topk`` has no effect by design. ``speed`` divides every delay.
    ``fault_scale`` multiplies the corruption probability and ``force_fault`` injects one kind
    in every chat response: both exist for tests and calibration. ``fault_rate`` (None: the
    fault model's load-dependent odds) corrupts each response with exactly that probability,
    whatever the load, the context or the pool (faults.py ``draw_at_rate``); in deterministic
    mode a re-send of a conversation (the replay oracle's) gives its clean answer.

    The KV pool (kvpool.py): ``kv_capacity`` tokens on the GPU tier (``/server_info``
    reports it as ``max_total_num_tokens``); with ``hicache="on"`` a host tier of
    ``hicache_ratio`` times that holds what the GPU tier evicts, and loading it back is what
    the race needs. ``calibrated_race`` adds the incident's calibrated odds (faults.py) for a
    pool that is never under pressure; off, only load-backs corrupt.

    Transport faults (transport.py) are drawn per request, seeded like the corruption faults:
    ``error_rate`` (HTTP 500/503), ``disconnect_rate`` (connection closed mid-response),
    ``stall_rate`` (no byte for ``stall_seconds`` mid-response), ``error_event_rate`` (an SSE
    error event; streamed requests only), ``bad_json_rate`` (an invalid JSON body or event),
    ``unencodable_rate`` (the output's bytes are no UTF-8 and the server says so, as llama.cpp
    does: an error event mid-stream, HTTP 500 otherwise; corruption, not a transport fault).
    ``crash_after`` ends the process abruptly on the chat request after that many;
    ``slow_start`` makes the health endpoints answer 503 for that many seconds; with
    ``api_key`` set every endpoint but health and metrics needs it as a bearer token.

    ``dialect``: the tool-call markup the scripted model writes (any registered dialect with
    an encoder); ``tool_parser="off"``: the server returns it raw in ``content``.
    As upstream servers: ``cache_report`` off leaves the cached-token count out of ``usage``
    (SGLang without ``--enable-cache-report``); the raw endpoints strip special tokens from
    their text unless a request sends ``skip_special_tokens: false``; ``raw_add_bos`` counts
    the BOS a tokenizer adds before a raw prompt that already starts with one.

    ``deterministic`` (``--enable-deterministic-inference``, as SGLang's flag): the answer
    depends only on the seed and the conversation, as always, and a request alone (nothing
    else running) is never corrupted, so "alone equals under load" holds except where the
    race injected under load (the replay oracle's ground truth).
    """

    index_k: str = "bf16"
    hicache: str = "on"
    topk: str = "v2"
    speed: float = 1.0
    seed: int = 0
    model: str = DEFAULT_MODEL
    kv_capacity: int = 50_000_000
    hicache_ratio: float = 2.0
    calibrated_race: bool = True
    chunk_tokens: int = 4
    max_running: int = 256
    fault_scale: float = 1.0
    fault_rate: float | None = None
    force_fault: str | None = None
    default_max_tokens: int = 4096
    error_rate: float = 0.0
    disconnect_rate: float = 0.0
    stall_rate: float = 0.0
    stall_seconds: float = 600.0
    error_event_rate: float = 0.0
    bad_json_rate: float = 0.0
    unencodable_rate: float = 0.0
    crash_after: int | None = None
    slow_start: float = 0.0
    cache_report: bool = True
    raw_add_bos: bool = False
    api_key: str | None = field(default=None, repr=False)  # never in logs
    dialect: str = "dsml-v4"  # the tool-call dialect the model writes (harness.sim.speaker)
    tool_parser: str = "on"
    reasoning: str = "off"  # where the model's reasoning goes (harness.sim.reasoning)
    #: as SGLang ``--enable-deterministic-inference``: a request alone gives exactly what it
    #: gives under load; only the race (which needs requests beside it) changes an answer
    deterministic: bool = False
    #: as SGLang ``--kv-canary log``: a ``kv_canary violation`` line in the log whenever the
    #: race corrupts a response (the page guard it overwrote)
    kv_canary: bool = False
    #: False: as a server with no scoring API (an OpenAI-compatible endpoint): the tokenize
    #: and teacher-forced scoring routes answer 404 (``--scoring off``)
    scoring: bool = True

    @property
    def transport_rates(self) -> tuple[tuple[str, float], ...]:
        """(kind, probability) of every transport fault, in draw order."""
        return (
            ("error", self.error_rate),
            ("disconnect", self.disconnect_rate),
            ("stall", self.stall_rate),
            ("error_event", self.error_event_rate),
            ("bad_json", self.bad_json_rate),
            ("unencodable", self.unencodable_rate),
        )

    def __post_init__(self) -> None:
        for name, value, allowed in (
            ("index_k", self.index_k, INDEX_K),
            ("hicache", self.hicache, HICACHE),
            ("topk", self.topk, TOPK),
            ("tool_parser", self.tool_parser, TOOL_PARSER),
            ("reasoning", self.reasoning, REASONING),
        ):
            if value not in allowed:
                raise UsageError(f"{name} must be one of {', '.join(allowed)}, not {value!r}")
        if self.fault_rate is not None and not 0.0 <= self.fault_rate <= 1.0:
            raise UsageError(f"fault_rate must be between 0 and 1, not {self.fault_rate}")
        if self.force_fault is not None and self.force_fault not in FAULT_KINDS:
            raise UsageError(
                f"force_fault must be one of {', '.join(FAULT_KINDS)}, not {self.force_fault!r}"
            )
        if not self.speed > 0:
            raise UsageError(f"speed must be a positive number, not {self.speed}")
        if not self.hicache_ratio > 0:
            raise UsageError(f"hicache_ratio must be a positive number, not {self.hicache_ratio}")
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
        rates = self.transport_rates
        for kind, rate in rates:
            if not 0.0 <= rate <= 1.0:
                raise UsageError(f"{kind}_rate must be between 0 and 1, not {rate}")
        if sum(rate for _, rate in rates) > 1.0 + 1e-9:
            raise UsageError("the transport fault rates add up to more than 1; lower some of them")
        if not self.stall_seconds > 0:
            raise UsageError(f"stall_seconds must be a positive number, not {self.stall_seconds}")
        if self.crash_after is not None and self.crash_after < 0:
            raise UsageError(f"crash_after must be zero or more, not {self.crash_after}")
        if self.slow_start < 0:
            raise UsageError(f"slow_start must be zero or more seconds, not {self.slow_start}")
        speaker(self.dialect)  # a UsageError naming the dialects it can write
        if self.api_key is not None and not self.api_key:
            raise UsageError("the API key is empty: set the variable named by --api-key-env")
