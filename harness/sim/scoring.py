"""The simulator's tokenizer and teacher-forced scores (SGLang's and vLLM's shapes).

Tokens: the text between the DeepSeek special tokens (which have small ids of their own) is
cut into chunks of three UTF-8 bytes (the last one shorter); a chunk's id is its bytes and
length packed into one integer. So ids
decode back to the text with no vocabulary to keep, and the same text is always the same ids.

Scores: the model is the scripted agent, so it knows what it would answer. For the
continuation after an assistant header, the simulator looks up the answer it gave that
conversation (``AnswerMemory``, filled by the engine, bounded), renders it with the same chat
template and aligns the two token lists (difflib): a token of its own answer is likely
(logprob about -0.15), a token it would not write is not (about -7), and neither is the first
token after a gap in the alignment (where the text skipped what it would have written); a
text that is no answer
of its own (a probe) gets a middling, text-dependent value (about -1.4). Every value is a
deterministic function of (previous id, id, position).

Under load: every request gets a little noise that grows with the requests running beside it
(batch composition changes the arithmetic, ~1e-4); and, with ``index_k=bf16`` and HiCache on,
the race perturbs a request's logprobs from some position on (``faults.logprob_race``), as a
racing index-K read shifts which keys attention sees. The response's ``x-sim-injected`` says
``logprob_race`` or ``none``: the ground truth per request.
"""

from __future__ import annotations

import difflib
import hashlib
import math
import random
import re
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from harness.dialects import dsml
from harness.dialects.prompt_v4 import ASSISTANT, BOS, END_THINK, THINK, USER, render_v4

SPECIAL_IDS = {tok: i + 1 for i, tok in enumerate((BOS, dsml.EOS, USER, ASSISTANT, THINK,
                                                    END_THINK, dsml.MARK))}  # fmt: skip
_SPECIAL_OF = {i: tok for tok, i in SPECIAL_IDS.items()}
_SPLIT = re.compile("(" + "|".join(re.escape(t) for t in SPECIAL_IDS) + ")")
NOISE_ALONE = 1e-4  # logprob noise of a request running alone
NOISE_PER_REQUEST = 2e-5  # more per request running beside it
RACE_SIGMA = 1.0  # the race's perturbation of a logprob (standard deviation)


def _chunks(data: bytes) -> np.ndarray:
    """Ids of ``data`` cut into chunks of three bytes (the last one shorter)."""
    n = len(data)
    full = n // 3
    arr = np.frombuffer(data[: full * 3], dtype=np.uint8).reshape(-1, 3).astype(np.int64)
    ids = (3 << 24) | (arr[:, 0] << 16) | (arr[:, 1] << 8) | arr[:, 2]
    rest = data[full * 3 :]
    if rest:
        tail = (len(rest) << 24) | int.from_bytes(rest.ljust(3, b"\0"), "big")
        ids = np.append(ids, tail)
    return ids


def tokenize(text: str) -> list[int]:
    parts: list[np.ndarray] = []
    for part in _SPLIT.split(text):
        if not part:
            continue
        special = SPECIAL_IDS.get(part)
        if special is not None:
            parts.append(np.array([special], dtype=np.int64))
        else:
            parts.append(_chunks(part.encode("utf-8")))
    if not parts:
        return []
    return [int(x) for x in np.concatenate(parts).tolist()]


def detokenize(ids: Sequence[int]) -> str:
    arr = np.asarray(ids, dtype=np.int64)
    if not len(arr):
        return ""
    special = arr < (1 << 24)
    out: list[str] = []
    start = 0
    for at in [*np.flatnonzero(special).tolist(), len(arr)]:
        if at > start:
            run = arr[start:at]
            raw = np.stack([(run >> 16) & 0xFF, (run >> 8) & 0xFF, run & 0xFF], axis=1)
            keep = np.arange(3)[None, :] < ((run >> 24) & 0x3)[:, None]
            out.append(raw.astype(np.uint8)[keep].tobytes().decode("utf-8", "replace"))
        if at < len(arr):
            out.append(_SPECIAL_OF.get(int(arr[at]), ""))
        start = at + 1
    return "".join(out)


def valid_ids(ids: Any) -> bool:
    return (
        isinstance(ids, list)
        and bool(ids)
        and all(isinstance(i, int) and not isinstance(i, bool) and 0 < i < 1 << 26 for i in ids)
    )


class AnswerMemory:
    """The clean answer the model gave each conversation (by prompt digest), LRU-bounded."""

    def __init__(self, capacity: int = 100_000) -> None:
        self.capacity = capacity
        self._answers: OrderedDict[bytes, dict[str, Any]] = OrderedDict()

    def remember(self, digest: bytes, message: dict[str, Any]) -> None:
        self._answers[digest] = message
        self._answers.move_to_end(digest)
        if len(self._answers) > self.capacity:
            self._answers.popitem(last=False)

    def get(self, digest: bytes) -> dict[str, Any] | None:
        return self._answers.get(digest)


def chat_tokens(
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
    add_generation_prompt: bool,
    continue_final_message: bool,
) -> list[int]:
    """The chat template's ids (DeepSeek V4): the generation header ends a prompt; a final
    assistant message to continue loses its end-of-sentence token."""
    text = render_v4(messages, tools)
    if continue_final_message and messages and messages[-1].get("role") == "assistant":
        text = text.removesuffix(dsml.EOS)
    elif not add_generation_prompt and text.endswith(ASSISTANT + END_THINK):
        text = text[: -len(ASSISTANT + END_THINK)]
    return tokenize(text)


def _unit(*parts: int) -> float:
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def expected_mask(cont: Sequence[int], reference: Sequence[int] | None) -> list[bool | None]:
    """Per continuation token: in the model's own answer (True), not (False), no answer
    known (None)."""
    if reference is None:
        return [None] * len(cont)
    mask: list[bool | None] = [False] * len(cont)
    matcher = difflib.SequenceMatcher(None, list(reference), list(cont), autojunk=False)
    for block in matcher.get_matching_blocks():
        for j in range(block.b, block.b + block.size):
            mask[j] = True
        if block.size and (block.a, block.b) != (0, 0):
            mask[block.b] = False  # the first token after a gap: not what the model expected
    return mask


def base_logprob(prev: int, tid: int, pos: int, expected: bool | None) -> float:
    h = _unit(prev, tid, pos)
    if expected is True:
        return -0.05 - 0.5 * h**4
    if expected is False:
        return -4.0 - 6.0 * h
    return -0.2 - 3.5 * h**2


def score_ids(
    ids: Sequence[int],
    start: int,
    reference: Sequence[int] | None,
    noise: float,
    race_from: int | None,
    rng: random.Random,
) -> list[float]:
    """Logprobs of ``ids[start:]`` (``start`` >= 1); ``reference``: the model's own answer
    after ``ids[:answer_start]`` when known (aligned against the tokens from there on)."""
    cont = ids[start:]
    # the answer aligned from where it starts: the prompt's tokens before it (the vLLM shape
    # scores them too) are no gap in the answer
    at = max(start, answer_start(ids) or start) if reference is not None else start
    mask = [None] * (at - start) + expected_mask(ids[at:], reference)
    out = []
    for j, tid in enumerate(cont):
        pos = start + j
        lp = base_logprob(ids[pos - 1], tid, pos, mask[j]) + rng.gauss(0.0, noise)
        if race_from is not None and pos >= race_from:
            lp += rng.gauss(0.0, RACE_SIGMA)
        out.append(min(lp, -1e-6))
    return out


def top_alternatives(tid: int, pos: int, lp: float, k: int) -> list[tuple[int, float]]:
    """The model's top-k at a position whose token ``tid`` has logprob ``lp``: the token
    itself and others sharing the rest of the mass (halving), the k likeliest. A token the
    model would not write (``lp`` low) is not among them: its first choice is another one,
    as a real model's top-k says (SGLang's ``input_top_logprobs``)."""
    if k <= 0:
        return []
    log_rest = math.log(max(1.0 - math.exp(lp), 1e-12))
    # the others' logprobs fall by ln 2 each: only those that make the top k get an id
    above = min(k, rank_of(lp) - 1)
    alts = [((3 << 24) | int(_unit(tid, pos, j) * 0xFFFFFF), log_rest - (j + 1) * math.log(2))
            for j in range(above)]  # fmt: skip
    alts.append((tid, lp))
    alts += [((3 << 24) | int(_unit(tid, pos, j) * 0xFFFFFF), log_rest - (j + 1) * math.log(2))
             for j in range(above, k - 1)]  # fmt: skip
    return alts[:k]


def rank_of(lp: float) -> int:
    """The rank of a token of logprob ``lp`` among ``top_alternatives`` (1: the model's first
    choice): one more than the others above it, the m-th of them at log(rest) - m ln 2."""
    x = (math.log(max(1.0 - math.exp(lp), 1e-12)) - lp) / math.log(2)
    return 1 + max(0, math.ceil(x) - 1)


def answer_start(ids: Sequence[int]) -> int | None:
    """The index after the last assistant header (and its think token), or None."""
    header = SPECIAL_IDS[ASSISTANT]
    for i in range(len(ids) - 1, -1, -1):
        if ids[i] == header:
            j = i + 1
            if j < len(ids) and ids[j] in (SPECIAL_IDS[END_THINK], SPECIAL_IDS[THINK]):
                j += 1
            return j
    return None


def is_scoring(payload: Any, api: str) -> bool:
    """A raw request that asks for prompt scores (token ids and logprobs, no text)."""
    if not isinstance(payload, dict):
        return False
    if api == "generate":
        return "input_ids" in payload
    prompt = payload.get("prompt")
    ids = isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], int)
    return ids or payload.get("prompt_logprobs") is not None
