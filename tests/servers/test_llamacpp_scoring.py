"""Teacher-forced scoring on the real llama.cpp server (SmolLM2-135M, CPU): the token-id
grammar route gives the same logprobs as unconstrained one-token steps, and a text it cannot
force is refused, never approximated. Skips without xllamacpp or the model."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from harness.client.scoring import Scorer, ScoringFailed, detect_api
from harness.dialects import dsml
from harness.dialects.base import ToolCall
from tests.servers.test_llamacpp import Launched, _need_engine, launch, stop

PROMPT = "The river rose through the night, and by morning the fields were"
TEXT = " a single sheet of grey water. The farmers moved their animals to the ridge."


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launched]:
    _need_engine()
    srv = launch(tmp_path_factory.mktemp("llama"), "--parallel", "2", "--ctx", "512",
                 "--threads", "1")  # fmt: skip
    try:
        yield srv
    finally:
        if srv.proc.poll() is None:
            stop(srv)


def _free_step(url: str, ids: list[int], want: int) -> float:
    """log P(want | ids) from one unconstrained step (the top 100 alternatives)."""
    body = {"prompt": ids, "n_predict": 1, "n_probs": 100, "temperature": 0,
            "cache_prompt": False}  # fmt: skip
    resp = httpx.post(url + "/completion", json=body, timeout=120)
    resp.raise_for_status()
    top = {
        t["id"]: t["logprob"] for t in resp.json()["completion_probabilities"][0]["top_logprobs"]
    }
    assert want in top, "the scored token is outside the top 100: pick another text"
    return float(top[want])


def test_grammar_of_token_ids_scores_faithfully(llama: Launched, tmp_path: Path) -> None:
    url = llama.base_url

    async def go() -> tuple[list[int], list[int], list[float], list[float], str]:
        async with Scorer(url, await detect_api(url)) as scorer:
            head = await scorer.tokenize(PROMPT)
            cont = await scorer.tokenize(TEXT)
            a = await scorer.score(head, cont, TEXT, top_k=3)
            b = await scorer.score(head, cont, TEXT)
            return head, cont, list(a.logprobs), list(b.logprobs), scorer.api

    head, cont, a, b, api = asyncio.run(go())
    assert api == "llamacpp"
    assert len(a) == len(cont) > 8
    assert a == pytest.approx(b, abs=1e-4)  # alone twice: the same arithmetic, nearly
    for i in (0, 3, len(cont) - 1):
        assert a[i] == pytest.approx(_free_step(url, head + cont[:i], cont[i]), abs=1e-3)


def test_text_the_grammar_cannot_force_is_refused(llama: Launched) -> None:
    block = dsml.encode_block([ToolCall("run_shell", {"command": "ls"})], "v4")

    async def go() -> None:
        async with Scorer(llama.base_url, "llamacpp") as scorer:
            head = await scorer.tokenize("Run it.\n\n")
            cont = await scorer.tokenize(block)  # the full-width bars are byte tokens
            with pytest.raises(ScoringFailed):
                await scorer.score(head, cont, block)

    asyncio.run(go())
