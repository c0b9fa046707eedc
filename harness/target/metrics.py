"""Server-side numbers during a run: Prometheus ``/metrics`` scraping, warm-up, cache flush.

``parse_prometheus`` reads the text exposition format; ``normalize`` maps SGLang, vLLM and
llama.cpp names onto one vocabulary (``running``, ``queued``, ``cache_usage``,
``cache_hit_rate``, ``hicache_host_used_tokens``, ``spec_accept_rate``). ``MetricsScraper``
polls ``<base_url>/metrics`` and appends rows
``{"variant", "repeat", "t", "wall", "name", "value"}`` to ``metrics.jsonl``; a server without
``/metrics`` is noted once and left alone. Nothing here raises into the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import httpx
import orjson

from harness.client.door import (
    FLUSH_TIMEOUT_S,
    LOOK_TIMEOUT_S,
    WARM_UP_TIMEOUT_S,
    server_client,
)
from harness.record.rundir import METRICS_FILE

log = logging.getLogger(__name__)


#: Gauges that are ratios: averaged over label sets (ranks, engines), not summed.
RATIO_METRICS = frozenset(
    {
        "sglang:token_usage",
        "sglang:cache_hit_rate",
        "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc",
        "vllm:gpu_prefix_cache_hit_rate",
        "llamacpp:kv_cache_usage_ratio",
        "sglang:spec_accept_rate",
        "sglang:spec_accept_length",
    }
)

#: normalized name -> source names, first present wins.
SOURCES: Mapping[str, tuple[str, ...]] = {
    "running": (
        "sglang:num_running_reqs",
        "vllm:num_requests_running",
        "llamacpp:requests_processing",
    ),
    "queued": (
        "sglang:num_queue_reqs",
        "vllm:num_requests_waiting",
        "llamacpp:requests_deferred",
    ),
    "cache_usage": (
        "sglang:token_usage",
        "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc",
        "llamacpp:kv_cache_usage_ratio",  # builds before 2025; current ones export none
    ),
    "cache_hit_rate": ("sglang:cache_hit_rate", "vllm:gpu_prefix_cache_hit_rate"),
    "hicache_host_used_tokens": ("sglang:hicache_host_used_tokens",),
    "spec_accept_rate": ("sglang:spec_accept_rate",),
}
#: Hit rates and acceptance rates over the last interval from counters, per server:
#: normalized name -> (numerator names, denominator names, denominator adds the numerator).
COUNTER_RATIOS: tuple[tuple[str, tuple[str, ...], tuple[str, ...], bool], ...] = (
    ("cache_hit_rate", ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits"),
     ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_queries"), False),
    # llama.cpp: prompt_tokens_total counts the tokens not taken from the cache
    ("cache_hit_rate", ("llamacpp:prompt_tokens_cached_total",),
     ("llamacpp:prompt_tokens_total",), True),
    ("spec_accept_rate", ("vllm:spec_decode_num_accepted_tokens_total",),
     ("vllm:spec_decode_num_draft_tokens_total",), False),
    ("spec_accept_rate", ("llamacpp:spec_decode_num_accepted_tokens_total",),
     ("llamacpp:spec_decode_num_draft_tokens_total",), False),
)  # fmt: skip
#: Raw series worth keeping beside the normalized ones.
EXTRA_RAW = (
    "sglang:cached_tokens_total", "sglang:num_used_tokens", "sglang:gen_throughput",
    "sglang:hicache_host_total_tokens", "sglang:spec_accept_length",
    "vllm:spec_decode_num_drafts_total", "llamacpp:n_busy_slots_per_decode",
)  # fmt: skip

_SAMPLE = re.compile(
    r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)"
    r"(?:\{(?P<labels>(?:[^}\"]|\"(?:[^\"\\]|\\.)*\")*)\})?"
    r"\s+(?P<value>\S+)(?:\s+-?\d+)?\s*$"
)


def parse_prometheus(text: str, *, mean: Iterable[str] = RATIO_METRICS) -> dict[str, float]:
    """Metric name -> value summed over its label sets (averaged for names in ``mean``).

    Comments, histogram buckets (``*_bucket``) and non-finite values are skipped; lines that
    do not parse are ignored (a scrape is best effort).
    """
    averaged = set(mean)
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            continue
        name = m.group("name")
        if name.endswith("_bucket"):
            continue
        try:
            value = float(m.group("value"))
        except ValueError:
            continue
        if not math.isfinite(value):
            continue
        sums[name] = sums.get(name, 0.0) + value
        counts[name] = counts.get(name, 0) + 1
    return {k: (v / counts[k] if k in averaged else v) for k, v in sums.items()}


def _first(metrics: Mapping[str, float], names: Iterable[str]) -> float | None:
    for name in names:
        if name in metrics:
            return metrics[name]
    return None


def normalize(
    metrics: Mapping[str, float], previous: Mapping[str, float] | None = None
) -> dict[str, float]:
    """The normalized names the server's metrics give (``SOURCES``, then ``COUNTER_RATIOS``).

    A ratio of counters (vLLM's prefix-cache hits over queries, llama.cpp's cached prompt
    tokens, speculative tokens accepted over drafted) is over the interval since
    ``previous`` when that scrape is given and the denominator grew, else since the server
    started. Names the server does not export are left out.
    """
    out: dict[str, float] = {}
    for norm, names in SOURCES.items():
        value = _first(metrics, names)
        if value is not None:
            out[norm] = value
    for norm, nums, dens, adds in COUNTER_RATIOS:
        if norm in out:
            continue
        num, den = _first(metrics, nums), _first(metrics, dens)
        if num is None or den is None:
            continue
        if adds:
            den += num
        if previous is not None:
            n0, d0 = _first(previous, nums), _first(previous, dens)
            if n0 is not None and d0 is not None:
                d0 += n0 if adds else 0.0
                if den > d0:
                    num, den = num - n0, den - d0
        if den > 0:
            out[norm] = num / den
    return out


def kept_raw(metrics: Mapping[str, float]) -> dict[str, float]:
    """The raw series written beside the normalized ones."""
    names = {n for group in SOURCES.values() for n in group}
    for _, nums, dens, _adds in COUNTER_RATIOS:
        names.update(nums, dens)
    names.update(EXTRA_RAW)
    return {k: v for k, v in metrics.items() if k in names}


class MetricsScraper:
    """Scrape ``<base_url>/metrics`` every ``interval_s`` into ``run_dir/metrics.jsonl``.

    Use as ``async with MetricsScraper(...):`` around a variant's load, or ``task =
    create_task(s.run())`` ... ``s.stop(); await task``. Never raises into the run: a 404
    stops it after one note (``self.unavailable``), transport errors are counted and retried.
    """

    def __init__(
        self,
        base_url: str,
        run_dir: Path,
        *,
        variant: str,
        repeat: int = 0,
        interval_s: float = 5.0,
        timeout_s: float = LOOK_TIMEOUT_S,
        keep_raw: bool = True,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.path = run_dir / METRICS_FILE
        self.variant = variant
        self.repeat = repeat
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.keep_raw = keep_raw
        self.scrapes = 0
        self.errors = 0
        self.unavailable: str | None = None
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._t0 = time.monotonic()
        self._previous: dict[str, float] | None = None

    def stop(self) -> None:
        self._stop.set()

    async def __aenter__(self) -> MetricsScraper:
        self._task = asyncio.create_task(self.run(), name=f"metrics {self.variant}")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
        if self._task is not None:
            try:
                await asyncio.wait_for(self._task, self.timeout_s + 1.0)
            except (TimeoutError, asyncio.CancelledError):
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await self._task

    async def run(self) -> None:
        self._t0 = time.monotonic()
        try:
            with open(self.path, "ab") as out:  # noqa: ASYNC230 - small appends, once per scrape
                async with server_client(self.base_url, timeout=self.timeout_s) as http:
                    while not self._stop.is_set():
                        if not await self._scrape(http, out):
                            return
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(self._stop.wait(), self.interval_s)
        except OSError as exc:
            log.warning("metrics: cannot write %s: %s", self.path, exc)
        except Exception:  # noqa: BLE001 - a scraper bug must not end the run
            log.exception("metrics scraper for %s stopped", self.base_url)

    async def _scrape(self, http: httpx.AsyncClient, out: IO[bytes]) -> bool:
        """One scrape; False when the server has no metrics endpoint."""
        t = time.monotonic() - self._t0
        try:
            resp = await http.get("/metrics")
        except httpx.HTTPError as exc:
            self.errors += 1
            if self.errors == 1:
                log.info("metrics: %s/metrics: %s (will retry)", self.base_url, exc)
            return True
        if resp.status_code in (404, 405, 501):
            self.unavailable = f"HTTP {resp.status_code}"
            log.info(
                "metrics: %s has no /metrics (HTTP %s); not scraping variant %s",
                self.base_url,
                resp.status_code,
                self.variant,
            )
            self._write(out, t, {"metrics_http_status": float(resp.status_code)})
            return False
        if resp.status_code != 200:
            self.errors += 1
            return True
        raw = parse_prometheus(resp.text)
        rows = normalize(raw, self._previous)
        if self.keep_raw:
            rows.update(kept_raw(raw))
        self._previous = raw
        self.scrapes += 1
        self._write(out, t, rows)
        return True

    def _write(self, out: IO[bytes], t: float, values: Mapping[str, float]) -> None:
        wall = round(time.time(), 3)  # to line the rows up with the turns' sent_at
        lines = b"".join(
            orjson.dumps(
                {
                    "variant": self.variant,
                    "repeat": self.repeat,
                    "t": round(t, 3),
                    "wall": wall,
                    "name": name,
                    "value": value,
                }
            )
            + b"\n"
            for name, value in values.items()
        )
        out.write(lines)
        out.flush()


async def flush_cache(
    base_url: str, *, timeout_s: float = FLUSH_TIMEOUT_S, api_key: str | None = None
) -> dict[str, Any]:
    """POST /flush_cache (SGLang, the simulator) with the API key when one is set.

    ``{"ok", "status", "message"}``: SGLang answers 400 while a request runs or waits and
    401 without the key it was started with; the run records a failure as a warning.
    """
    try:
        async with server_client(base_url, api_key=api_key, timeout=timeout_s) as http:
            resp = await http.post("/flush_cache")
    except httpx.HTTPError as exc:
        log.warning("flush_cache on %s failed: %s", base_url, exc)
        return {"ok": False, "status": None, "message": f"{type(exc).__name__}: {exc}"}
    if resp.status_code == 200:
        return {"ok": True, "status": 200, "message": "flushed"}
    why = {
        400: "the server was busy (SGLang refuses while a request runs or waits)",
        401: "unauthorized: give the server's key with --api-key-env",
        404: "the server has no /flush_cache",
    }.get(resp.status_code, resp.text[:200].strip())
    log.warning("flush_cache on %s: HTTP %s %s", base_url, resp.status_code, why)
    return {"ok": False, "status": resp.status_code, "message": f"HTTP {resp.status_code}: {why}"}


async def warm_up(
    base_url: str,
    model: str,
    *,
    requests: int = 2,
    timeout_s: float = WARM_UP_TIMEOUT_S,
    api_key: str | None = None,
) -> bool:
    """A few tiny chat requests so first-request costs (JIT, graphs) stay out of the results.

    True when every request answered 200; failures are logged, never raised.
    """
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": "Reply with the word ready."}],
        "max_tokens": 8,
        "temperature": 0,
        "stream": False,
    }
    ok = True
    try:
        async with server_client(base_url, api_key=api_key, timeout=timeout_s) as http:
            for _ in range(requests):
                resp = await http.post("/v1/chat/completions", json=body)
                if resp.status_code != 200:
                    log.warning("warm-up on %s: HTTP %s", base_url, resp.status_code)
                    ok = False
    except httpx.HTTPError as exc:
        log.warning("warm-up on %s failed: %s", base_url, exc)
        return False
    return ok
