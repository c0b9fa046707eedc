"""``--canary``: the probes scored alone before the load, at a steady bounded rate during it,
and alone after it (``canary.jsonl``; the deviations are computed by
analysis/canary_deviations.py).

The canary has its own connection pool and sends at most ``rate_per_s`` requests a second,
at most ``MAX_INFLIGHT`` at once: it never changes the sessions' requests, and its share of the
requests is in the summary. A probe the server cannot score faithfully (llama.cpp's grammar
route tokenizing it otherwise) is dropped once, with the reason logged and recorded; a
server that cannot score at all ends the canary for the variant, said once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.client.scoring import Scorer, ScoringFailed, ScoringMismatch, detect_api
from harness.record.rundir import CANARY_FILE, TURNS_FILE
from harness.record.turns import JsonlAppender
from harness.run.options import RunOptions
from harness.workload.canary_probes import Probe, probes, session_probe

log = logging.getLogger(__name__)

ALONE_BEFORE, LOAD, ALONE_AFTER = "alone_before", "load", "alone_after"
DEFAULT_RATE = 1.0  # canary requests a second during the load
NOISE_REPEATS = 3  # alone scores of each probe before the load (the noise floor)
TOP_K = 5
MAX_INFLIGHT = 4  # canary requests at once during the load
SESSION_PROBES = 2  # probes made of the sessions' own healthy turns, added during the load


@dataclass
class _Ready:
    probe: Probe
    prompt_ids: list[int]
    cont_ids: list[int]


class Canary:
    """The canary of one variant (one repeat) on one server."""

    def __init__(
        self,
        scorer: Scorer,
        probes: list[Probe],
        run_dir: Path,
        base: dict[str, Any],
        *,
        rate_per_s: float = DEFAULT_RATE,
        repeats: int = NOISE_REPEATS,
        inflight: Callable[[], int | None] = lambda: None,
        announce: Callable[[str], None] = lambda _msg: None,
    ) -> None:
        self.scorer = scorer
        self.probes = probes
        self.base = {k: base[k] for k in ("run_id", "variant", "repeat") if k in base}
        self.rate = rate_per_s
        self.repeats = repeats
        self.inflight = inflight
        self.announce = announce
        self.ready: list[_Ready] = []
        self.dead: str | None = None  # why the server cannot score (said once)
        self.requests = 0
        self._out = JsonlAppender(run_dir / CANARY_FILE)
        self._turns = run_dir / TURNS_FILE
        self._turns_at = 0  # how far turns.jsonl was read for session probes
        self.session_probes = 0
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._t0 = time.perf_counter()

    def _write(self, row: dict[str, Any]) -> None:
        self._out.append(json.dumps({**self.base, **row}).encode() + b"\n")

    async def prepare(self) -> None:
        """Tokenize the probes once (the same ids every time they are scored)."""
        for probe in self.probes:
            try:
                prompt = await self.scorer.tokenize(probe.prompt)
                cont = await self.scorer.tokenize(probe.continuation)
            except ScoringFailed as exc:
                self._give_up(f"cannot tokenize the canary probes: {exc}")
                return
            if prompt and cont:
                self.ready.append(_Ready(probe, prompt, cont))

    def _give_up(self, why: str) -> None:
        if self.dead is None:
            self.dead = why
            self.announce(f"{self.base.get('variant')}: canary off: {why}")
            self._write({"phase": "off", "error": why})

    async def _score(self, item: _Ready, phase: str, round_: int) -> str | None:
        """Score one probe into a row; the error, or None."""
        inflight = self.inflight() if phase == LOAD else 0
        self.requests += 1
        row: dict[str, Any] = {
            "phase": phase, "probe": item.probe.name, "round": round_,
            "t_s": round(time.perf_counter() - self._t0, 3), "inflight": inflight,
            "prompt_tokens": len(item.prompt_ids), "tokens": len(item.cont_ids),
        }  # fmt: skip
        try:
            got = await self.scorer.score(
                item.prompt_ids, item.cont_ids, item.probe.continuation, top_k=TOP_K
            )
        except ScoringMismatch as exc:
            self.ready = [r for r in self.ready if r is not item]
            log.warning("canary probe %s dropped: %s", item.probe.name, exc)
            row["error"] = f"mismatch: {exc}"
        except ScoringFailed as exc:
            row["error"] = str(exc)
        else:
            row.update(
                logprobs=[round(x, 7) for x in got.logprobs],
                top=[{str(k): round(v, 5) for k, v in t.items()} for t in got.top or []],
                injected=got.injected, cached_tokens=got.cached_tokens,
                latency_s=round(got.latency_s, 4),
            )  # fmt: skip
        self._write(row)
        error = row.get("error")
        return str(error) if error is not None else None

    async def alone(self, phase: str, repeats: int) -> None:
        """Every probe ``repeats`` times on the idle server."""
        for round_ in range(repeats):
            items = list(self.ready)
            errors = [await self._score(item, phase, round_) for item in items]
            if phase != ALONE_BEFORE or round_ > 0:
                continue
            if errors and all(e is not None for e in errors):
                self._give_up(str(errors[0]))  # not one probe scored: the server cannot
                return
            for item, error in zip(items, errors, strict=True):
                if error is not None and item in self.ready:  # this probe cannot be scored
                    self.ready.remove(item)
                    log.warning("canary probe %s dropped: %s", item.probe.name, error)

    async def before(self) -> None:
        await self.prepare()
        if self.dead is None:
            await self.alone(ALONE_BEFORE, self.repeats)
        if self.dead is None and not self.ready:
            self._give_up("no probe could be scored faithfully")

    def start(self) -> None:
        """Score the probes in turn during the load: one every 1/rate seconds, at most
        ``MAX_INFLIGHT`` at once (a slow long probe does not stall the others)."""
        if self.dead is None and self.ready and self.rate > 0:
            self._task = asyncio.create_task(self._loop())

    async def _loop(self) -> None:
        period = 1.0 / self.rate
        slots = asyncio.Semaphore(MAX_INFLIGHT)
        pending: set[asyncio.Task[str | None]] = set()

        async def one(item: _Ready, round_: int) -> str | None:
            try:
                return await self._score(item, LOAD, round_)
            finally:
                slots.release()

        rounds: dict[str, int] = {}
        turn = 0
        try:
            while not self._stop.is_set() and self.ready:
                await self._add_session_probe()
                item = self.ready[turn % len(self.ready)]
                turn += 1
                round_ = rounds.get(item.probe.name, 0)
                rounds[item.probe.name] = round_ + 1
                await slots.acquire()
                if self._stop.is_set():
                    slots.release()
                    return
                task = asyncio.create_task(one(item, round_))
                pending.add(task)
                task.add_done_callback(pending.discard)
                try:
                    await asyncio.wait_for(self._stop.wait(), period)
                    return
                except TimeoutError:
                    continue
        finally:
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)

    async def _add_session_probe(self) -> None:
        """Up to ``SESSION_PROBES`` probes made of this variant's own healthy turns, read
        from turns.jsonl as the load writes it (whole lines; their alone reference is the
        score after the load)."""
        if self.session_probes >= SESSION_PROBES:
            return
        try:
            with open(self._turns, "rb") as fh:  # noqa: ASYNC230 - a local file, a few lines
                fh.seek(self._turns_at)
                data = fh.read(1 << 20)
        except OSError:
            return
        cut = data.rfind(b"\n") + 1
        self._turns_at += cut
        for line in data[:cut].splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if rec.get("variant") != self.base.get("variant") or rec.get("repeat") != self.base.get(
                "repeat"
            ):
                continue
            probe = session_probe(rec, self.session_probes)
            if probe is None:
                continue
            try:
                head = await self.scorer.tokenize(probe.prompt)
                cont = await self.scorer.tokenize(probe.continuation)
            except ScoringFailed:
                return
            if head and cont:
                self.ready.append(_Ready(probe, head, cont))
                self.session_probes += 1
                return

    async def stop(self) -> None:
        """End the load phase (the request in flight finishes)."""
        self._stop.set()
        if self._task is not None:
            try:
                await self._task
            except Exception:  # noqa: BLE001 - the canary never fails the run
                log.exception("the canary's load phase failed")
            self._task = None

    async def after(self) -> None:
        if self.dead is None:
            await self.alone(ALONE_AFTER, 1)

    async def aclose(self) -> None:
        self._out.close()
        await self.scorer.aclose()


async def open_canary(
    opts: RunOptions,
    base_url: str,
    model: str,
    base: dict[str, Any],
    inflight: Callable[[], int | None],
    announce: Callable[[str], None],
) -> Canary:
    """The variant's canary on its server, its alone scores before the load done."""
    api, endpoint, rate = opts.after.scoring_api, opts.endpoint, opts.after.canary_rate
    if api == "auto":
        api = await detect_api(base_url, endpoint.api_key)
    scorer = Scorer(base_url, api, model=model, api_key=endpoint.api_key,  # type: ignore[arg-type]
                    timeout=endpoint.request_timeout)  # fmt: skip
    canary = Canary(
        scorer, probes(opts.scenario), opts.out_dir, base, rate_per_s=rate,
        inflight=inflight, announce=announce,
    )  # fmt: skip
    try:
        await canary.before()
    except BaseException:
        await canary.aclose()
        raise
    announce(
        f"{base.get('variant')}: canary: {len(canary.ready)} probes scored alone "
        f"{canary.repeats} times ({api}); {rate:g} a second during the load"
    )
    return canary
