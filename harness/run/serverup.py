"""The server-up phase of a variant run (``harness.run.variant``): the server starts (or
stays up from the block before), a shard notes its clock's offset, a launched server is
flushed and warmed up, the first contact reads its facts and checks the variant, the
variant's dialect is decided. What it learns is a ``Served``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from harness.analysis import variantcheck
from harness.client import connections_for
from harness.client.spec import ClientSpec
from harness.record.rundir import RunDir
from harness.run.options import RunOptions
from harness.run.oracle_replay import exactness
from harness.run.serverprobe import Contact, first_contact
from harness.run.shard import server_clock_offset
from harness.target.launch import Target, make_target
from harness.target.metrics import flush_cache, warm_up
from harness.target.readiness import EndpointTarget, server_version
from harness.target.spec import ENDPOINT_READY
from harness.workload.dialect import DialectChoice, choose, model_names
from harness.workload.matrix import Variant


@dataclass(frozen=True)
class Served:
    """What the server-up phase learned: where the server is, what it serves."""

    base_url: str
    model: str
    version: str | None
    client: ClientSpec
    #: the run's options with this variant's dialect (and the canary on where the replay
    #: oracle cannot be exact), and where the dialect came from
    opts: RunOptions
    dialect_from: str | None


def target_for(opts: RunOptions, variant: Variant, repeat: int) -> Target:
    endpoint = opts.endpoint
    if endpoint.url or endpoint.target is None:
        assert endpoint.url is not None
        ready = ENDPOINT_READY
        if endpoint.ready_timeout is not None:
            ready = ready.waiting(endpoint.ready_timeout)
        return EndpointTarget(endpoint.url, ready, endpoint.api_key)
    extra = endpoint.sim_args if endpoint.target.name == "sim" else ()
    return make_target(
        endpoint.target, variant, opts.out_dir, extra_args=extra, repeat=repeat,
        api_key=endpoint.api_key,
    )  # fmt: skip


def record_dialect(opts: RunOptions, variant: str, choice: DialectChoice) -> None:
    """Add the variant's dialect to run.json (written at the start, before any server)."""
    run_dir = RunDir(opts.out_dir)
    if not run_dir.run_file.exists():
        return
    meta = run_dir.read_meta()
    dialects = meta.get("dialects")
    dialects = dialects if isinstance(dialects, dict) else {}
    run_dir.write_meta({**meta, "dialects": {**dialects, variant: choice.to_dict()}})


@dataclass
class ServerUp:
    """The phase, for one block."""

    opts: RunOptions
    variant: Variant
    repeat: int
    target: Target
    held: bool  # kept up from the block before
    sessions: int  # the sessions to drive on it
    in_flight: int  # the requests in flight the client needs connections for
    clock: dict[str, Any] | None  # a shard's clock.json, the server's offset to add
    announce: Callable[[str], None]
    name: str  # the block's, before what is said of it
    dialect_from: str | None = None

    def say(self, what: str) -> None:
        self.announce(f"{self.name}: {what}")

    async def run(self) -> Served:
        """Start the server (or find it up), make first contact, decide the dialect."""
        opts, endpoint, held = self.opts, self.opts.endpoint, self.held
        how = {"launch": "starting the server", "hook": "running the before hook"}
        where = self.target.describe()
        first = how.get(where.get("mode", ""), "waiting for " + str(where.get("url")))
        self.say("the server stays up" if held else first)
        facts: dict[str, Any] | None = None
        if held:
            base_url = str(getattr(self.target, "base_url", ""))
            key = (self.variant.label, self.repeat)
            mine = [
                r for r in variantcheck.load(opts.out_dir) if (r["variant"], r["repeat"]) == key
            ]
            facts = mine[-1] if mine else None
        else:
            base_url = await self.target.start()
            clock = self.clock
            if clock is not None and clock.get("server_offset_s") is None:
                clock["server_offset_s"] = await server_clock_offset(base_url, endpoint.api_key)
                RunDir(opts.out_dir).clock.write_text(json.dumps(clock, indent=2) + "\n")
        if facts is None:  # the first contact with this server
            flush = await self._prepare_server(base_url) if not held else None
            facts = await first_contact(self._contact(base_url, flush), self.announce)
        model = str(facts["model"])
        self.say(f"{self.sessions} sessions on {base_url}")
        version = await server_version(base_url, endpoint.api_key)
        await self._decide_dialect(base_url, model)
        after = self.opts.after
        if "replay" in after.oracles and not after.canary and self.sessions:
            target = endpoint.target
            exact, why = exactness(
                facts.get("config") or {}, bool(target is not None and target.deterministic)
            )
            if not exact:  # the replay compares scores here: the canary's KL
                self.say(f"replay not exact ({why}): canary on")
                self.opts = replace(self.opts, after=replace(after, canary=True))
        client = ClientSpec(
            base_url,
            model,
            endpoint.api_key,
            connections_for(max(self.in_flight, 1)),
            endpoint.request_timeout,
            self.opts.source.api,
            endpoint.limits,
            bool((facts.get("rendering") or {}).get("drop_bos")),
        )
        return Served(base_url, model, version, client, self.opts, self.dialect_from)

    async def _decide_dialect(self, base_url: str, model: str) -> None:
        """The variant's dialect, from the option, the scenario or the served model's name
        (harness.workload.dialect); announced, in run.json, and the one its sessions use."""
        opts = self.opts
        names = await model_names(base_url, model, opts.endpoint.api_key)
        choice = choose(
            opts.scenario.dialect, names, from_option=opts.provenance.dialect_from_option
        )
        if names[0] != model:  # both said: the name the requests carry, what is served
            self.say(
                f"the server does not list {model} (the requests' model); it serves "
                f"{names[0]}: the dialect follows what it serves"
            )
        self.say(f"dialect {choice.describe()}")
        record_dialect(opts, self.variant.label, choice)
        self.dialect_from = choice.source
        self.opts = replace(opts, scenario=replace(opts.scenario, dialect=choice.name))

    async def _prepare_server(self, base_url: str) -> dict[str, Any] | None:
        """A launched server's cache flush and warm-up, when its target file asks; the
        flush's outcome (a failure is a warning: the repeats may not start alike)."""
        endpoint = self.opts.endpoint
        spec, flush = endpoint.launched, None
        if spec is not None:
            if spec.flush_cache:
                flush = await flush_cache(base_url, api_key=endpoint.api_key)
                if not flush["ok"]:
                    self.say(f"warning: the cache flush failed: {flush['message']}")
            if spec.warm_up:
                await warm_up(base_url, endpoint.model or spec.model, api_key=endpoint.api_key)
        return flush

    def _contact(self, base_url: str, flush: dict[str, Any] | None) -> Contact:
        opts, endpoint = self.opts, self.opts.endpoint
        spec = endpoint.launched
        return Contact(
            run_dir=opts.out_dir,
            variant=self.variant,
            repeat=self.repeat,
            base_url=base_url,
            described=self.target.describe(),
            rules=spec.rules_for(self.variant) if spec is not None else {},
            model=endpoint.model,
            model_source=opts.provenance.model_source(endpoint.model),
            api_key=endpoint.api_key,
            api=opts.source.api,
            scenario=opts.scenario,
            flush=flush,
            strict=endpoint.strict_variants,
        )
