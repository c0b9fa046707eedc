"""Teacher-forced scoring on the real llama.cpp server (SmolLM2-135M, CPU): the token-id
grammar route gives the same logprobs as unconstrained one-token steps, and tokens it cannot
force are scored around (never approximated): the rest exactly, the skipped ones said. Skips
without xllamacpp or the model."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from harness.client.scoring import Scorer, ScoringMismatch, detect_api
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


def _free_step(url: str, ids: list[int], want: int, partial_ok: bool = False) -> float | None:
    """log P(want | ids) from one unconstrained step (the top 100 alternatives); with
    ``partial_ok``, None where the step's token was a byte of an unfinished character (the
    server then holds back its probabilities)."""
    body = {"prompt": ids, "n_predict": 1, "n_probs": 100, "temperature": 0,
            "cache_prompt": False}  # fmt: skip
    resp = httpx.post(url + "/completion", json=body, timeout=120)
    resp.raise_for_status()
    if partial_ok and "completion_probabilities" not in resp.json():
        return None
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


def test_tokens_the_grammar_cannot_force_are_scored_around(llama: Launched) -> None:
    # a full-width bar is three byte tokens, none a whole character, and an end of turn ends
    # the generation: llama.cpp's grammar forces neither (HTTP 500). The text is scored in
    # runs around them, every token scored exactly, the ones skipped said
    text = " The sign read \uff5cexit\uff5c in blue.<|im_end|>\nThen the farmers left the ridge."
    many = " a\uff5c" * 20
    url = llama.base_url

    async def go() -> tuple[list[int], list[int], object, list[int]]:
        async with Scorer(url, "llamacpp") as scorer:
            head = await scorer.tokenize(PROMPT)
            cont = await scorer.tokenize(text)
            got = await scorer.score(head, cont, text, top_k=1)
            with pytest.raises(ScoringMismatch, match="segments"):  # that text, not the server
                await scorer.score(head, await scorer.tokenize(many), many)
            return head, cont, got, await scorer.tokenize("<|im_end|>")

    head, cont, got, [end] = asyncio.run(go())
    skipped = set(got.skipped)  # type: ignore[attr-defined]
    bars = [j for j, t in enumerate(cont) if j in skipped and t != end]
    assert len(bars) == 6  # two bars of three bytes
    assert [j for j, t in enumerate(cont) if t == end] == [j for j in skipped if cont[j] == end]
    scored = [j for j in range(len(cont)) if j not in skipped]
    assert list(got.ids) == [cont[j] for j in scored]  # type: ignore[attr-defined]
    assert len(got.logprobs) == len(got.top) == len(scored)  # type: ignore[attr-defined]
    # the tokens right after a skipped run, scored after the true bytes before them (where
    # the model's own next step is a byte token, the server holds back that step's
    # probabilities, so those positions cannot be checked this way)
    after = [j for j in scored if j - 1 in skipped]
    checked = 0
    for j in after:
        want = _free_step(url, head + cont[:j], cont[j], partial_ok=True)
        if want is not None:
            k = scored.index(j)
            assert got.logprobs[k] == pytest.approx(want, abs=1e-3)  # type: ignore[attr-defined]
            checked += 1
    assert checked >= 2
