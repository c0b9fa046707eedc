"""What one run is asked to do: ``RunOptions``, built once by the command layer from its flags.

It is made of the value objects each stage reads, so that a stage takes the one it needs:

- ``Schedule``: the variants, their repeats and order, the rounds of --until-significant, the
  run's time limit (``execute``);
- ``Endpoint``: where each variant's requests go and how each is sent (the server phase, the
  client);
- ``LoadSpec``: how hard each variant is driven (the load phase: the permits, the workers);
- ``SessionSource`` (``harness.drive.trace_session``): how the sessions are built;
- ``AfterLoad``: the passes on the idle server after the load, and what they need kept;
- ``Provenance``: what run.json and the report say of how the run was asked for.

No argparse namespace comes here: the command layer reads its flags and fills these.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from harness.client import DEFAULT_REQUEST_TIMEOUT
from harness.client.response_limits import Limits
from harness.drive.trace_session import SessionSource
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

__all__ = [
    "DEMO_FAULT_SCALE",
    "AfterLoad",
    "Endpoint",
    "LoadSpec",
    "Provenance",
    "RunOptions",
    "Schedule",
    "SessionSource",
]

#: --demo's fault odds on the simulator (x6: a demo shows corruption within a minute, some 7
#: of 48 sessions; the odds grow faster than the scale, x10 gives some 19); a replay of a
#: demo run launches the simulator with them too.
DEMO_FAULT_SCALE = 6.0


@dataclass(frozen=True)
class Schedule:
    """Which variants run, how often, in what order, and for how long at most."""

    variants: tuple[Variant, ...]
    repeats: int = 1
    order: Order = "abab"
    max_sessions: int | None = None  # --until-significant: the budget per variant
    alpha: float = 0.05  # --until-significant's level
    run_timeout: float | None = None  # the whole run stops after this long (exit code 3)

    def blocks(self) -> list[tuple[Variant, int]]:
        """Every (variant, repeat), in the planned order."""
        return run_order(list(self.variants), self.repeats, scheme=self.order)


@dataclass(frozen=True)
class Endpoint:
    """Where each variant's requests go, and how each request is sent."""

    url: str | None = None  # --endpoint: one server already up (None: ``target``)
    target: TargetSpec | None = None  # how each variant becomes a server (None: ``url``)
    model: str | None = None  # None: the first model the server lists in /v1/models
    api_key: str | None = None
    stream: bool = True
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT
    limits: Limits = field(default_factory=Limits)
    sim_args: tuple[str, ...] = ()  # the simulator's own flags (seed, speed, --demo's odds)
    metrics_interval: float = 1.0  # seconds between scrapes of the server's /metrics
    strict_variants: bool = False  # a variant its server does not confirm stops the run
    ready_timeout: float | None = None  # --ready-timeout: every readiness wait (None: defaults)

    @property
    def launched(self) -> TargetSpec | None:
        """The target file's spec when the servers come from it (not with --endpoint)."""
        return self.target if not self.url else None


@dataclass(frozen=True)
class LoadSpec:
    """How hard each variant is driven: ``concurrency`` becomes the variant's permits
    (``harness.drive.permits``), split over the shards and the workers."""

    sessions: int
    concurrency: int
    workers: int = 1  # processes driving each variant's sessions (harness.pool.parent)
    cluster: str | None = None  # --workers ray[:ADDRESS]: the Ray address ("": the default)
    judges: int | None = None  # --judges: classifying processes (None: auto, 0: on the loop)
    on_corruption: OnCorruption = "retry"
    shard: Shard | None = None  # --shard I/K: this host drives the I-th of K slices
    start_at: float | None = None  # --start-at: wall time (unix seconds) the load starts


@dataclass(frozen=True)
class AfterLoad:
    """The passes on each variant's idle server after its load (``harness.run.afterload``),
    the canary beside the load, and what they need kept of it."""

    confirm: bool = False  # re-send every corrupted turn alone after the variant's load
    reference_sessions: int = 0  # sessions re-run one at a time after the variant's load
    #: "auto": the judge scores the flagged turns after each variant's load where the server
    #: can score (the confirmed tier of the verdict); "off": the text detector alone
    judge: Literal["auto", "off"] = "auto"
    judge_sample: float = 0.1  # the share of passed turns (of kept transcripts) also judged
    judge_concurrency: int = 1  # --judge-concurrency: the judge's scores in flight at once
    scoring_api: str = "auto"  # auto | sglang | vllm | llamacpp (client.scoring)
    canary: bool = False  # score the canary probes alone, under load, alone (run.canary)
    canary_rate: float = 1.0  # canary requests a second during the load
    oracles: tuple[str, ...] = ()  # --oracle: replay, spec_accept, kv_canary
    oracle_sample: float = 1.0  # --oracle-sample: the share of sends the replay re-sends
    #: --oracle-concurrency: the sessions whose re-sends the replay sends at once (1: alone)
    oracle_concurrency: int = 1
    spec_rules: SpecRules = field(default_factory=SpecRules)  # --oracle spec_accept's rules
    server_log: Path | None = None  # --oracle kv_canary with --endpoint: the log to read
    keep_transcripts: bool = False  # all sessions' transcripts, not only corrupted ones


@dataclass(frozen=True)
class Provenance:
    """How the run was asked for, as run.json and the report say it."""

    args: dict[str, Any] = field(default_factory=dict)  # the parsed options (secrets masked)
    command: str = ""  # the command line as typed
    model_from_option: bool = False  # the model was named by --model (not the target file)
    dialect_from_option: bool = False  # the scenario's dialect came from --dialect

    def model_source(self, model: str | None) -> str:
        if model is None:
            return "discovered: the first model of /v1/models"
        return "--model" if self.model_from_option else "the target file"


@dataclass(frozen=True)
class RunOptions:
    scenario: Scenario
    out_dir: Path
    schedule: Schedule
    endpoint: Endpoint
    load: LoadSpec
    source: SessionSource = field(default_factory=SessionSource)
    after: AfterLoad = field(default_factory=AfterLoad)
    provenance: Provenance = field(default_factory=Provenance)

    def plan_id(self) -> str:
        """A name for what a run does (the scenario's content, factors, sessions, seed...): the
        same for every shard of one run on any host, different when any of those differ."""
        scenario = {k: v for k, v in dataclasses.asdict(self.scenario).items() if k != "source"}
        src = self.source
        workload = None
        if src.workload is not None:
            workload = hashlib.sha256(Path(src.workload).read_bytes()).hexdigest()
        wanted = {
            "scenario": scenario,
            "variants": [v.as_dict() for v in self.schedule.variants],
            "workload": workload,
            "sessions": self.load.sessions,
            "concurrency": self.load.concurrency,
            "seed": src.seed,
            "repeats": self.schedule.repeats,
            "order": self.schedule.order,
            "stream": self.endpoint.stream,
            "on_corruption": self.load.on_corruption,
            "api": src.api,
            "workload_mode": src.mode,
            "pace": src.pace,
            "max_sessions": self.schedule.max_sessions,
        }
        text = json.dumps(wanted, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]
