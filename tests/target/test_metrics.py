"""Prometheus parsing, normalization, the scraper against loopback servers, warm-up, flush."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from harness.target.metrics import (
    METRICS_FILE,
    MetricsScraper,
    flush_cache,
    kept_raw,
    normalize,
    parse_prometheus,
    warm_up,
)
from tests.standins import free_port, running_standin

SGLANG = """\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="deepseek-ai/DeepSeek-V4-Flash",dp_rank="0"} 37.0
sglang:num_running_reqs{model_name="deepseek-ai/DeepSeek-V4-Flash",dp_rank="1"} 41.0
sglang:num_queue_reqs{model_name="deepseek-ai/DeepSeek-V4-Flash",dp_rank="0"} 2.0
sglang:num_queue_reqs{model_name="deepseek-ai/DeepSeek-V4-Flash",dp_rank="1"} 0.0
sglang:token_usage{model_name="deepseek-ai/DeepSeek-V4-Flash",dp_rank="0"} 0.8
sglang:token_usage{model_name="deepseek-ai/DeepSeek-V4-Flash",dp_rank="1"} 0.6
sglang:cache_hit_rate{model_name="deepseek-ai/DeepSeek-V4-Flash",dp_rank="0"} 0.9
sglang:cached_tokens_total{model_name="deepseek-ai/DeepSeek-V4-Flash"} 1.2e+06
# HELP sglang:e2e_request_latency_seconds Histogram of end-to-end request latency.
# TYPE sglang:e2e_request_latency_seconds histogram
sglang:e2e_request_latency_seconds_bucket{le="0.1",model_name="m"} 3.0
sglang:e2e_request_latency_seconds_bucket{le="+Inf",model_name="m"} 10.0
sglang:e2e_request_latency_seconds_sum{model_name="m"} 42.5
sglang:e2e_request_latency_seconds_count{model_name="m"} 10.0
"""

VLLM = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="deepseek-ai/DeepSeek-V3.2"} 64.0
vllm:num_requests_waiting{engine="0",model_name="deepseek-ai/DeepSeek-V3.2"} 16.0
vllm:kv_cache_usage_perc{engine="0",model_name="deepseek-ai/DeepSeek-V3.2"} 0.42
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="deepseek-ai/DeepSeek-V3.2"} 20000.0
vllm:prefix_cache_hits_total{engine="0",model_name="deepseek-ai/DeepSeek-V3.2"} 15000.0
vllm:prefix_cache_queries_created{engine="0",model_name="deepseek-ai/DeepSeek-V3.2"} 1.7e9
"""

# The names and HELP lines of the llama.cpp server xllamacpp 0.2 ships (its /metrics read for
# real): no kv_cache_usage_ratio any more; cached prompt tokens counted apart.
LLAMACPP = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed, excluding cached tokens
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 3000
# HELP llamacpp:prompt_tokens_cached_total Number of prompt tokens reused from the cache
# TYPE llamacpp:prompt_tokens_cached_total counter
llamacpp:prompt_tokens_cached_total 1000
llamacpp:spec_decode_num_draft_tokens_total 400
llamacpp:spec_decode_num_accepted_tokens_total 300
llamacpp:requests_processing 7
llamacpp:requests_deferred 3
llamacpp:n_busy_slots_per_decode 2.5
"""

SGLANG_HICACHE_SPEC = """\
sglang:hicache_host_used_tokens{model_name="m",tp_rank="0"} 52000.0
sglang:hicache_host_total_tokens{model_name="m",tp_rank="0"} 400000.0
sglang:spec_accept_rate{model_name="m",tp_rank="0"} 0.62
sglang:spec_accept_length{model_name="m",tp_rank="0"} 2.4
"""

VLLM_SPEC = """\
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 100.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 300.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 150.0
"""


def test_parse_sums_label_sets_and_skips_buckets_and_comments() -> None:
    m = parse_prometheus(SGLANG)
    assert m["sglang:num_running_reqs"] == 78.0
    assert m["sglang:num_queue_reqs"] == 2.0
    assert m["sglang:token_usage"] == pytest.approx(0.7)  # a ratio: averaged over ranks
    assert m["sglang:cached_tokens_total"] == 1.2e6
    assert m["sglang:e2e_request_latency_seconds_count"] == 10.0
    assert not any(k.endswith("_bucket") for k in m)


def test_parse_handles_tricky_labels_timestamps_and_junk() -> None:
    text = (
        'x{path="/a b}",msg="say \\"hi\\", {ok}"} 2 1700000000000\n'
        'x{path="/c"} 3\n'
        "y NaN\n"
        "z +Inf\n"
        "w -1.5e-1\n"
        "this is not a sample\n"
        "v notanumber\n"
    )
    m = parse_prometheus(text)
    assert m == {"x": 5.0, "w": -0.15}


def test_normalize_sglang() -> None:
    assert normalize(parse_prometheus(SGLANG)) == pytest.approx(
        {"running": 78.0, "queued": 2.0, "cache_usage": 0.7, "cache_hit_rate": 0.9}
    )


def test_normalize_vllm_cumulative_and_windowed_hit_rate() -> None:
    now = parse_prometheus(VLLM)
    assert normalize(now) == pytest.approx(
        {"running": 64.0, "queued": 16.0, "cache_usage": 0.42, "cache_hit_rate": 0.75}
    )
    before = dict(now)
    before["vllm:prefix_cache_queries_total"] = 10000.0
    before["vllm:prefix_cache_hits_total"] = 9000.0
    # over the window: 6000 hits of 10000 queries
    assert normalize(now, before)["cache_hit_rate"] == pytest.approx(0.6)
    # no new queries in the window: fall back to the cumulative rate
    assert normalize(now, now)["cache_hit_rate"] == pytest.approx(0.75)


def test_normalize_llamacpp_and_unknown_server() -> None:
    now = parse_prometheus(LLAMACPP)
    # the hit rate: cached of all prompt tokens (its prompt_tokens_total leaves them out)
    assert normalize(now) == pytest.approx(
        {"running": 7.0, "queued": 3.0, "cache_hit_rate": 0.25, "spec_accept_rate": 0.75}
    )
    before = {**now, "llamacpp:prompt_tokens_total": 2000.0,
              "llamacpp:prompt_tokens_cached_total": 200.0}  # fmt: skip
    assert normalize(now, before)["cache_hit_rate"] == pytest.approx(800 / 1800)
    assert "llamacpp:n_busy_slots_per_decode" in kept_raw(now)
    assert normalize(parse_prometheus("process_cpu_seconds_total 3\n")) == {}


def test_normalize_hicache_and_speculative_acceptance() -> None:
    sglang = normalize(parse_prometheus(SGLANG_HICACHE_SPEC))
    assert sglang == pytest.approx({"hicache_host_used_tokens": 52000.0, "spec_accept_rate": 0.62})
    assert "sglang:hicache_host_total_tokens" in kept_raw(parse_prometheus(SGLANG_HICACHE_SPEC))
    now = parse_prometheus(VLLM_SPEC)
    assert normalize(now) == pytest.approx({"spec_accept_rate": 0.5})
    before = {**now, "vllm:spec_decode_num_draft_tokens_total": 200.0,
              "vllm:spec_decode_num_accepted_tokens_total": 140.0}  # fmt: skip
    assert normalize(now, before)["spec_accept_rate"] == pytest.approx(0.1)  # the collapse


def read_rows(run_dir: Path) -> list[dict[str, object]]:
    path = run_dir / METRICS_FILE
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_scraper_writes_rows_from_a_live_server(tmp_path: Path) -> None:
    with running_standin("--flavor", "vllm") as url:
        scraper = MetricsScraper(url, tmp_path, variant="kv=fp8", repeat=1, interval_s=0.1)
        async with scraper:
            for _ in range(100):  # bounded: until a few scrapes happened
                if scraper.scrapes >= 3:
                    break
                await asyncio.sleep(0.05)
    assert scraper.scrapes >= 3
    assert scraper.unavailable is None
    rows = read_rows(tmp_path)
    assert {r["variant"] for r in rows} == {"kv=fp8"}
    assert {r["repeat"] for r in rows} == {1}
    by_name: dict[object, list[dict[str, object]]] = {}
    for r in rows:
        by_name.setdefault(r["name"], []).append(r)
    assert by_name["running"][0]["value"] == 2.0
    assert by_name["cache_usage"][0]["value"] == 0.125
    assert by_name["cache_hit_rate"][0]["value"] == 0.75
    assert "vllm:num_requests_running" in by_name  # raw series kept too
    times = [r["t"] for r in by_name["running"]]
    assert times == sorted(times)


async def test_scraper_stops_quietly_without_metrics(tmp_path: Path) -> None:
    with running_standin("--flavor", "none") as url:
        scraper = MetricsScraper(url, tmp_path, variant="v", interval_s=0.05)
        await asyncio.wait_for(scraper.run(), 10)  # returns by itself after the 404
    assert scraper.unavailable == "HTTP 404"
    assert scraper.scrapes == 0
    rows = read_rows(tmp_path)
    assert len(rows) == 1
    assert rows[0]["name"] == "metrics_http_status"
    assert rows[0]["value"] == 404.0


async def test_scraper_survives_a_dead_server_and_stops(tmp_path: Path) -> None:
    scraper = MetricsScraper(
        f"http://127.0.0.1:{free_port()}", tmp_path, variant="v", interval_s=0.05
    )
    task = asyncio.create_task(scraper.run())
    for _ in range(100):
        if scraper.errors >= 2:
            break
        await asyncio.sleep(0.05)
    scraper.stop()
    await asyncio.wait_for(task, 10)
    assert scraper.errors >= 2
    assert scraper.scrapes == 0


async def test_scraper_against_the_simulator(tmp_path: Path) -> None:
    from harness.target.launch import make_target
    from harness.target.targetfile import default_sim_target
    from harness.workload.matrix import Variant

    target = make_target(default_sim_target(), Variant(()), tmp_path)
    url = await target.start()
    try:
        async with MetricsScraper(url, tmp_path, variant="default", interval_s=0.1) as scraper:
            for _ in range(100):
                if scraper.scrapes >= 2:
                    break
                await asyncio.sleep(0.05)
        assert (await flush_cache(url))["ok"] is True
    finally:
        await target.stop()
    names = {r["name"] for r in read_rows(tmp_path)}
    assert {"running", "queued", "cache_usage", "cache_hit_rate"} <= names


async def test_warm_up_and_flush_cache() -> None:
    with running_standin() as url:
        assert await warm_up(url, "m", requests=2) is True
        assert (await flush_cache(url))["ok"] is True
        assert (await flush_cache(url + "/"))["ok"] is True
        async with httpx.AsyncClient(trust_env=False) as http:
            assert (await http.get(url + "/flushes")).text == "2"
    dead = f"http://127.0.0.1:{free_port()}"
    assert (await flush_cache(dead, timeout_s=2))["ok"] is False
    assert await warm_up(dead, "m", timeout_s=2) is False


async def test_flush_cache_sends_the_key_and_says_why_it_failed(
    make_sim: Callable[..., str],
) -> None:
    url = make_sim(api_key="s3cret")
    refused = await flush_cache(url)
    assert refused["ok"] is False
    assert refused["status"] == 401
    assert "--api-key-env" in refused["message"]
    assert (await flush_cache(url, api_key="s3cret"))["ok"] is True
