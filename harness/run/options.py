"""What one run is asked to do: ``RunOptions``, built by the command layer from its flags."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from harness.client import DEFAULT_REQUEST_TIMEOUT
from harness.client.response_limits import Limits
from harness.run.oracle_alarms import SpecRules
from harness.run.plan import run_order
from harness.run.shard import Shard
from harness.target.spec import TargetSpec
from harness.workload.matrix import Variant
from harness.workload.scenario import Scenario

Order = Literal["abab", "abba"]  # how repeats interleave
OnCorruption = Literal["retry", "stop"]  # re-send a corrupted turn, or end its session
WorkloadMode = Literal["replay", "continue"]  # a trace's requests as recorded, or live answers
Pace = Literal["recorded", "fast"]  # a trace's turns at their offsets, or at once
Api = Literal["chat", "completions", "generate"]  # who parses the tool calls


#: --demo's fault odds on the simulator (x4: a demo shows corruption within a minute); a
#: replay of a demo run launches the simulator with them too.
DEMO_FAULT_SCALE = 4.0


@dataclass(frozen=True)
class RunOptions:
    scenario: Scenario
    variants: tuple[Variant, ...]
    out_dir: Path
    sessions: int
    concurrency: int
    target: TargetSpec | None = None  # None: --endpoint
    seed: int = 1
    repeats: int = 1
    order: Order = "abab"
    stream: bool = True
    on_corruption: OnCorruption = "retry"
    endpoint: str | None = None
    model: str | None = None  # None: the first model the server lists in /v1/models
    api_key: str | None = None
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT
    limits: Limits = field(default_factory=Limits)
    run_timeout: float | None = None
    sim_args: tuple[str, ...] = ()
    metrics_interval: float = 1.0  # seconds between scrapes of the server's /metrics
    keep_transcripts: bool = False  # all sessions' transcripts, not only corrupted ones
    confirm: bool = False  # re-send every corrupted turn alone after the variant's load
    reference_sessions: int = 0  # sessions re-run one at a time after the variant's load
    canary: bool = False  # score the canary probes alone, under load, alone (run.canary)
    canary_rate: float = 1.0  # canary requests a second during the load
    scoring_api: str = "auto"  # auto | sglang | vllm | llamacpp (client.scoring)
    judge_sample: float = 0.1  # the share of passed turns (of kept transcripts) also judged
    #: "auto": the judge scores the flagged turns after each variant's load where the server
    #: can score (the confirmed tier of the verdict); "off": the text detector alone
    judge: Literal["auto", "off"] = "auto"
    oracles: tuple[str, ...] = ()  # --oracle: "replay" (harness.run.oracle_replay)
    oracle_sample: float = 1.0  # --oracle-sample: the share of sends the replay re-sends
    passkeys: bool = False  # --passkeys: plant ids in tool results, ask for them back
    spec_rules: SpecRules = field(default_factory=SpecRules)  # --oracle spec_accept's rules
    server_log: Path | None = None  # --oracle kv_canary with --endpoint: the log to read
    workload: Path | None = None  # a trace (JSONL): its conversations are the sessions
    workload_mode: WorkloadMode = "replay"  # replay | continue (harness.drive.trace_session)
    pace: Pace = "recorded"  # recorded | fast
    api: Api = "chat"  # chat | completions | generate (harness.client.raw)
    max_sessions: int | None = None  # --until-significant: the budget per variant
    workers: int = 1  # processes driving each variant's sessions (harness.pool.parent)
    judges: int | None = None  # --judges: classifying processes (None: auto, 0: on the loop)
    cluster: str | None = None  # --workers ray[:ADDRESS]: the Ray address ("": the default)
    alpha: float = 0.05
    strict_variants: bool = False  # a variant its server does not confirm stops the run
    shard: Shard | None = None  # --shard I/K: this host drives the I-th of K slices
    start_at: float | None = None  # --start-at: wall time (unix seconds) the load starts
    dialect_from_option: bool = False  # the scenario's dialect came from --dialect
    args: dict[str, Any] = field(default_factory=dict)  # the parsed options, for run.json
    command: str = ""  # the command line as typed, for run.json and the report

    def schedule(self) -> list[tuple[Variant, int]]:
        return run_order(list(self.variants), self.repeats, scheme=self.order)
