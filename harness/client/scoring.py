"""Teacher-forced scoring: the log-probabilities a server gives a given text, no generation.

``Scorer.score(prompt_ids, cont_ids, cont_text)`` returns one log-probability per token of the
continuation (log P(token | everything before it)), plus the top-k alternatives where the
server gives them. One adapter per server shape:

* ``sglang`` -- ``POST /generate`` with ``input_ids``, ``max_new_tokens: 0``,
  ``return_logprob`` and ``logprob_start_len = c - 1`` (the first entry is null);
* ``vllm`` -- ``POST /v1/completions`` with the ids as ``prompt``, ``max_tokens: 1`` and
  ``prompt_logprobs: k`` (the generated token is ignored);
* ``llamacpp`` -- llama.cpp has no prompt logprobs. The continuation is forced token by
  token instead: a GBNF grammar of exactly its token ids (``root ::= <[id]> <[id]> ...``),
  ``n_probs`` with pre-sampling logprobs (a softmax of the raw logits, before the grammar
  masks them), temperature 0, ``cache_prompt: false``. Each token costs a decode step, not a
  prefill. A grammar of the literal text instead lets the sampler pick another tokenization
  of the same text (`` they`` as `` the`` + ``y``), so it is not used. The returned ids are
  checked against the given ones; a mismatch is ``ScoringMismatch`` (skipped, never
  approximated). Two kinds of token cannot be forced by a grammar there (the server answers
  HTTP 500, "Unexpected empty grammar stack"): a byte token that is no whole UTF-8 character
  (``/tokenize`` gives its piece as a list of bytes) and a control token (an end of turn, which
  ends the generation). A continuation with such tokens is scored in segments around them:
  each run of forceable tokens after everything before it (the unforceable ones in the
  prompt), so every token scored is scored exactly, and the ones skipped are said
  (``Scored.skipped``); at most ``MAX_SEGMENTS`` segments, else ``ScoringMismatch`` (that text
  is not scored; the server still can score).

The simulator speaks the SGLang and the vLLM shapes, so both adapters run against a real
loopback server in the tests. Token ids come from the server's own tokenizer (``tokenize``,
``chat_ids``), so a text scored twice is the same tokens both times.
"""

from __future__ import annotations

import re
import time
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import httpx

from harness.client.door import GENERATE_TIMEOUT_S, server_client
from harness.errors import InfrastructureError, UsageError
from harness.record import safejson

ScoringApi = Literal["sglang", "vllm", "llamacpp"]
SCORING_APIS: tuple[ScoringApi, ...] = ("sglang", "vllm", "llamacpp")
INJECTED_HEADER = "x-sim-injected"
#: llama.cpp: the most segments a continuation is scored in around tokens it cannot force
MAX_SEGMENTS = 16
#: the shape of a control token's text (``<|im_end|>``, ``<｜end▁of▁sentence｜>``, ``</s>``,
#: ``[INST]``): such a piece is checked with the tokenizer (``parse_special`` off)
_CONTROL_SHAPE = re.compile(r"^(?:<[^\s<>]{1,40}>|\[/?[A-Z_]{2,20}\])$")
#: llama.cpp's answer when its grammar cannot force a token of the continuation
_GRAMMAR_REFUSED = re.compile(r"HTTP 500: .*grammar", re.DOTALL)
_JSON = {"content-type": "application/json"}


class ScoringFailed(InfrastructureError):
    """One scoring request got no usable answer (transport, HTTP status, shape)."""


class ScoringMismatch(ScoringFailed):
    """The text cannot be scored faithfully there, though the server can score: llama.cpp's
    grammar route chose another tokenization, or the tokens it cannot force cannot be scored
    around (too many runs, a text that does not tokenize back to the same ids)."""


@dataclass(frozen=True)
class Scored:
    """The teacher-forced scores of one continuation."""

    ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    top: tuple[dict[int, float], ...] | None  # per token: id -> logprob, when asked for
    cached_tokens: int | None
    injected: str | None  # the simulator's ground truth for the request (x-sim-injected)
    latency_s: float
    #: positions of the continuation the server could not score (llama.cpp: tokens its
    #: grammar cannot force); ``ids``, ``logprobs`` and ``top`` hold the others, in order
    skipped: tuple[int, ...] = ()


def gbnf_tokens(ids: Sequence[int]) -> str:
    """A GBNF grammar whose only sentence is these token ids (llama.cpp's ``<[id]>``)."""
    return "root ::= " + " ".join(f"<[{int(i)}]>" for i in ids)


def _float(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ScoringFailed(f"the server's {what} is not a number: {value!r}")
    return float(value)


class Scorer:
    """Scores texts teacher-forced on one server, over its own connection pool (apart from
    the sessions' client) of ``connections``."""

    def __init__(
        self,
        base_url: str,
        api: ScoringApi,
        *,
        model: str | None = None,
        api_key: str | None = None,
        timeout: float = GENERATE_TIMEOUT_S,
        connections: int = 4,
    ) -> None:
        if api not in SCORING_APIS:
            raise UsageError(f"unknown scoring API {api!r}: use one of {', '.join(SCORING_APIS)}")
        self.base_url = base_url.rstrip("/")
        self.api = api
        self.model = model
        self._http = server_client(
            self.base_url, api_key=api_key, timeout=timeout, max_connections=max(connections, 1)
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> Scorer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _post(self, path: str, body: Mapping[str, Any]) -> tuple[Any, httpx.Response]:
        # (orjson both ways: a conversation of thousands of tokens and their ids, per request)
        try:
            resp = await self._http.post(path, content=safejson.dumps(dict(body)), headers=_JSON)
        except httpx.HTTPError as exc:
            raise ScoringFailed(f"{path}: {type(exc).__name__}: {exc}") from None
        except safejson.Unencodable as exc:
            raise ScoringFailed(f"{path}: the request cannot be written as JSON: {exc}") from None
        if resp.status_code != 200:
            raise ScoringFailed(f"{path}: HTTP {resp.status_code}: {resp.text[:200]}")
        try:
            return safejson.loads(resp.content), resp
        except ValueError:
            raise ScoringFailed(f"{path}: the answer is not JSON") from None

    def _model(self) -> dict[str, Any]:
        return {"model": self.model} if self.model else {}

    # ------------------------------------------------------------------ tokens

    async def tokenize(self, text: str) -> list[int]:
        """``text``'s token ids by the server's tokenizer, no special tokens added."""
        if self.api == "llamacpp":
            data, _ = await self._post("/tokenize", {"content": text, "add_special": False})
        else:
            path = "/v1/tokenize" if self.api == "sglang" else "/tokenize"
            body = {**self._model(), "prompt": text, "add_special_tokens": False}
            data, _ = await self._post(path, body)
        return _ids(data.get("tokens") if isinstance(data, dict) else None)

    async def detokenize(self, ids: Sequence[int]) -> str:
        """The text of ``ids`` by the server's tokenizer."""
        if self.api == "llamacpp":
            data, _ = await self._post("/detokenize", {"tokens": list(ids)})
            text = data.get("content") if isinstance(data, dict) else None
        else:
            path = "/v1/detokenize" if self.api == "sglang" else "/detokenize"
            data, _ = await self._post(path, {**self._model(), "tokens": list(ids)})
            key = "text" if self.api == "sglang" else "prompt"
            text = data.get(key) if isinstance(data, dict) else None
        if not isinstance(text, str):
            raise ScoringFailed("the server's detokenize answer has no text")
        return text

    async def chat_ids(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
        reply: Mapping[str, Any],
    ) -> tuple[list[int], int]:
        """The ids of ``messages`` + the assistant ``reply`` as the chat template renders
        them, and the index where the reply starts (the prompt with its generation header
        is a prefix of the whole)."""
        if self.api == "llamacpp":
            data, _ = await self._post("/apply-template", {"messages": list(messages)})
            prompt = str(data.get("prompt", "")) if isinstance(data, dict) else ""
            text = str(reply.get("content") or "")
            head = await self.tokenize(prompt)
            return head + await self.tokenize(text), len(head)
        path = "/v1/tokenize" if self.api == "sglang" else "/tokenize"
        extra: dict[str, Any] = {**self._model(), "add_special_tokens": False}
        if tools:
            extra["tools"] = list(tools)
        head_data, _ = await self._post(
            path, {**extra, "messages": list(messages), "add_generation_prompt": True}
        )
        whole_data, _ = await self._post(
            path,
            {**extra, "messages": [*messages, dict(reply)], "add_generation_prompt": False,
             "continue_final_message": True},
        )  # fmt: skip
        head, whole = _ids(head_data.get("tokens")), _ids(whole_data.get("tokens"))
        return whole, common_prefix(head, whole)

    # ------------------------------------------------------------------ scores

    async def score(
        self, prompt_ids: Sequence[int], cont_ids: Sequence[int], cont_text: str, top_k: int = 0
    ) -> Scored:
        """Teacher-forced logprobs of ``cont_ids`` after ``prompt_ids`` (not empty)."""
        if not prompt_ids or not cont_ids:
            raise UsageError("scoring needs a prompt and a continuation of at least one token")
        t0 = time.perf_counter()
        if self.api == "sglang":
            lps, top, cached, resp = await self._sglang(prompt_ids, cont_ids, top_k)
        elif self.api == "vllm":
            lps, top, cached, resp = await self._vllm(prompt_ids, cont_ids, top_k)
        else:
            try:
                lps, top, cached, resp = await self._llamacpp(prompt_ids, cont_ids, top_k)
            except ScoringMismatch:
                raise
            except ScoringFailed as exc:
                if not _GRAMMAR_REFUSED.search(str(exc)):
                    raise
                return await self._llamacpp_segments(prompt_ids, cont_ids, top_k, t0)
        return Scored(
            tuple(int(i) for i in cont_ids), tuple(lps), tuple(top) if top_k else None, cached,
            resp.headers.get(INJECTED_HEADER), time.perf_counter() - t0,
        )  # fmt: skip

    async def _sglang(
        self, prompt_ids: Sequence[int], cont_ids: Sequence[int], top_k: int
    ) -> tuple[list[float], list[dict[int, float]], int | None, httpx.Response]:
        start = len(prompt_ids) - 1
        body = {
            "input_ids": [*prompt_ids, *cont_ids],
            "sampling_params": {"max_new_tokens": 0, "temperature": 0},
            "return_logprob": True,
            "logprob_start_len": start,
            "top_logprobs_num": top_k,
        }
        data, resp = await self._post("/generate", body)
        meta = data.get("meta_info") if isinstance(data, dict) else None
        if not isinstance(meta, dict) or not isinstance(meta.get("input_token_logprobs"), list):
            raise ScoringFailed("/generate: no meta_info.input_token_logprobs in the answer")
        items = meta["input_token_logprobs"][1:]  # the first entry is always null
        tops = meta.get("input_top_logprobs") or []
        tops = tops[1:] if len(tops) == len(items) + 1 else tops
        if len(items) != len(cont_ids):
            raise ScoringFailed(f"/generate: {len(items)} logprobs for {len(cont_ids)} tokens")
        lps, top = [], []
        for j, (item, tid) in enumerate(zip(items, cont_ids, strict=True)):
            if not isinstance(item, list) or len(item) < 2 or item[1] != tid:
                raise ScoringMismatch(f"/generate: logprob {j} is not for token {tid}: {item!r}")
            lps.append(_float(item[0], "logprob"))
            alts = tops[j] if j < len(tops) and isinstance(tops[j], list) else []
            top.append({int(a[1]): _float(a[0], "top logprob") for a in alts if a})
        cached = meta.get("cached_tokens")
        return lps, top, cached if isinstance(cached, int) else None, resp

    async def _vllm(
        self, prompt_ids: Sequence[int], cont_ids: Sequence[int], top_k: int
    ) -> tuple[list[float], list[dict[int, float]], int | None, httpx.Response]:
        body = {
            **self._model(),
            "prompt": [*prompt_ids, *cont_ids],
            "max_tokens": 1,
            "temperature": 0,
            "prompt_logprobs": top_k,
        }
        data, resp = await self._post("/v1/completions", body)
        try:
            entries = data["choices"][0]["prompt_logprobs"]
        except (KeyError, IndexError, TypeError):
            raise ScoringFailed("/v1/completions: no choices[0].prompt_logprobs") from None
        if not isinstance(entries, list) or len(entries) != len(prompt_ids) + len(cont_ids):
            raise ScoringFailed("/v1/completions: prompt_logprobs do not cover the prompt")
        lps, top = [], []
        for j, tid in enumerate(cont_ids):
            entry = entries[len(prompt_ids) + j]
            mine = entry.get(str(tid)) if isinstance(entry, dict) else None
            if not isinstance(mine, dict):
                raise ScoringMismatch(f"/v1/completions: no logprob for token {tid} at {j}")
            lps.append(_float(mine.get("logprob"), "logprob"))
            top.append({int(k): _float(v.get("logprob"), "top logprob") for k, v in entry.items()})
        usage = data.get("usage") or {}
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        return lps, top, cached if isinstance(cached, int) else None, resp

    async def _unforceable(self, cont_ids: Sequence[int]) -> set[int]:
        """Positions of ``cont_ids`` that llama.cpp's grammar cannot force: byte tokens that
        are no whole character, control tokens. Read from the tokenizer's pieces of the
        continuation's text; ``ScoringFailed`` when that text does not tokenize back to the
        same ids (then no segment can be placed for sure)."""
        text = await self.detokenize(cont_ids)
        body = {"content": text, "add_special": False, "with_pieces": True}
        data, _ = await self._post("/tokenize", body)
        tokens = data.get("tokens") if isinstance(data, dict) else None
        if not isinstance(tokens, list) or [
            t.get("id") if isinstance(t, dict) else None for t in tokens
        ] != list(cont_ids):
            raise ScoringMismatch(
                "the text holds tokens llama.cpp's grammar cannot force, and it does not "
                "tokenize back to the same ids to score around them"
            )
        out, control = set(), {}
        for j, t in enumerate(tokens):
            piece = t.get("piece")
            if not isinstance(piece, str):
                out.add(j)  # (a list of bytes: no whole UTF-8 character)
            elif _CONTROL_SHAPE.match(piece):
                if piece not in control:
                    plain = {"content": piece, "add_special": False, "parse_special": False}
                    got, _ = await self._post("/tokenize", plain)
                    control[piece] = _ids(got.get("tokens")) != [t.get("id")]
                if control[piece]:
                    out.add(j)
        return out

    async def _llamacpp_segments(
        self, prompt_ids: Sequence[int], cont_ids: Sequence[int], top_k: int, t0: float
    ) -> Scored:
        """``cont_ids`` scored in runs around the tokens the grammar cannot force."""
        skip = await self._unforceable(cont_ids)
        if not skip:
            raise ScoringMismatch("/completion: the grammar refused a token that looks forceable")
        runs: list[tuple[int, int]] = []
        for j in range(len(cont_ids)):
            if j in skip:
                continue
            if runs and runs[-1][1] == j:
                runs[-1] = (runs[-1][0], j + 1)
            else:
                runs.append((j, j + 1))
        if len(runs) > MAX_SEGMENTS:
            raise ScoringMismatch(
                f"{len(skip)} tokens llama.cpp's grammar cannot force split the text into "
                f"{len(runs)} segments (at most {MAX_SEGMENTS} are scored)"
            )
        ids: list[int] = []
        lps: list[float] = []
        top: list[dict[int, float]] = []
        injected = None
        for a, b in runs:
            head = [*prompt_ids, *cont_ids[:a]]
            got_lps, got_top, _, resp = await self._llamacpp(head, cont_ids[a:b], top_k)
            ids += cont_ids[a:b]
            lps += got_lps
            top += got_top
            injected = injected or resp.headers.get(INJECTED_HEADER)
        return Scored(
            tuple(int(i) for i in ids), tuple(lps), tuple(top) if top_k else None, None,
            injected, time.perf_counter() - t0, tuple(sorted(skip)),
        )  # fmt: skip

    async def _llamacpp(
        self, prompt_ids: Sequence[int], cont_ids: Sequence[int], top_k: int
    ) -> tuple[list[float], list[dict[int, float]], int | None, httpx.Response]:
        body = {
            "prompt": list(prompt_ids),
            "grammar": gbnf_tokens(cont_ids),
            "n_probs": max(top_k, 1),
            "post_sampling_probs": False,
            "temperature": 0,
            "n_predict": len(cont_ids),
            "cache_prompt": False,
            "return_tokens": True,
        }
        data, resp = await self._post("/completion", body)
        probs = data.get("completion_probabilities") if isinstance(data, dict) else None
        if not isinstance(probs, list):
            raise ScoringFailed("/completion: no completion_probabilities in the answer")
        got = [p.get("id") for p in probs if isinstance(p, dict)]
        if got != list(cont_ids):
            raise ScoringMismatch(
                f"/completion: the grammar produced other tokens than the given ones "
                f"({len(got)} for {len(cont_ids)}): the text cannot be scored faithfully here"
            )
        lps = [_float(p.get("logprob"), "logprob") for p in probs]
        top = [
            {int(a["id"]): _float(a.get("logprob"), "top logprob") for a in p.get("top_logprobs")
             or []}
            for p in probs
        ]  # fmt: skip
        return lps, top, None, resp


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the longest common prefix of ``a`` and ``b`` (slices compared, not
    items one by one: a conversation is thousands of ids)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def _ids(value: Any) -> list[int]:
    if isinstance(value, list):
        try:
            array("q", value)  # (every item an integer, checked at C speed)
            return list(value)
        except (TypeError, OverflowError):
            if all(isinstance(i, int) for i in value):
                return list(value)
    raise ScoringFailed("the tokenizer's answer has no list of token ids")


async def detect_api(base_url: str, api_key: str | None = None) -> ScoringApi:
    """The scoring shape a server speaks: SGLang (``/server_info``), llama.cpp (``/props``
    with ``default_generation_settings``), else vLLM."""
    async with server_client(base_url, api_key=api_key) as http:
        for path, api in (("/server_info", "sglang"), ("/props", "llamacpp")):
            try:
                resp = await http.get(path)
            except httpx.HTTPError:
                continue
            if resp.status_code == 200:
                return api  # type: ignore[return-value]
    return "vllm"
