"""Raw mode (``--api completions|generate``): the harness renders the prompt and parses the output.

The chat body a session builds is rendered to the exact DeepSeek prompt text
(``prompt_v4.render_v4`` for ``dsml-v4``, ``render_v32`` for ``dsml-v32``) and sent to
``/v1/completions`` (``prompt``, ``max_tokens``, ``temperature``, ``stream``) or SGLang's
``/generate`` (``text``, ``sampling_params``). The answer's text comes back unparsed
(``TurnOutput.source == "raw"``): the session classifies it with ``source="raw"``, so the
tool calls are the harness's own parse of the DSML, not the server's
(``harness.drive.raw_session``; ``harness.analysis.rawcompare`` sets a raw run against a chat
run).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from harness.client.chat import ChatClient
from harness.client.output import TurnOutput
from harness.dialects import dsml
from harness.dialects.prompt_v4 import BOS, END_THINK, THINK, render_v4, render_v32
from harness.errors import UsageError
from harness.record.payload import HistoryEncoder

APIS = ("chat", "completions", "generate")


PATHS = {"completions": "/v1/completions", "generate": "/generate"}


_RENDERERS = {"dsml-v4": render_v4, "dsml-v32": render_v32}


def check_api(api: str, dialect: str) -> None:
    """A UsageError unless ``api`` can run with the scenario's ``dialect``."""
    if api not in APIS:
        raise UsageError(f"--api {api!r}: use one of {', '.join(APIS)}")
    if api != "chat" and dialect not in _RENDERERS:
        raise UsageError(
            f"--api {api} renders DeepSeek prompts only: the scenario's dialect is {dialect!r}, "
            f"use {' or '.join(_RENDERERS)} (or --api chat)"
        )


def render_prompt(body: Mapping[str, Any], dialect: str) -> str:
    """The prompt text of one chat request body (its messages and tools)."""
    render = _RENDERERS.get(dialect)
    if render is None:
        raise UsageError(f"raw mode cannot render a prompt for dialect {dialect!r}")
    return render(body["messages"], body.get("tools") or None)


def raw_payload(api: str, prompt: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """The request of ``api`` for ``prompt`` with the chat body's sampling settings.

    ``skip_special_tokens`` is false: the servers default to true and would strip the think
    delimiters and, where they are special tokens, the DSML marks from the text (SGLang's chat
    path turns it off itself when tools are given; the raw paths do not)."""
    sampling = {k: body[k] for k in ("temperature", "max_tokens", "seed") if k in body}
    sampling["skip_special_tokens"] = False
    if api == "completions":
        return {"prompt": prompt, **sampling}
    names = {"max_tokens": "max_new_tokens", "seed": "sampling_seed"}  # SGLang's names
    params = {names.get(k, k): v for k, v in sampling.items()}
    return {"text": prompt, "sampling_params": params}


def finish_raw(out: TurnOutput, prompt: str) -> TurnOutput:
    """Split the reasoning off a thinking-mode output; put back the end-of-turn token that a
    server trims when it stops on it (a stop is a complete turn, not a missing token)."""
    text = out.content
    if prompt.endswith(THINK) and END_THINK in text:
        reasoning, _, text = text.partition(END_THINK)
        out.reasoning = reasoning
    if out.finish_reason == "stop" and text and not text.endswith(dsml.EOS):
        text += dsml.EOS
    out.content = text
    return out


class RawClient:
    """The client as the sessions see it in raw mode: ``chat(body)`` sends the rendered prompt.

    ``drop_bos``: the server puts its own BOS before a prompt, so the rendered one is left out
    (``check_rendering`` finds out)."""

    def __init__(self, client: ChatClient, api: str, dialect: str, drop_bos: bool = False) -> None:
        check_api(api, dialect)
        self._client = client
        self.api = api
        self.dialect = dialect
        self.drop_bos = drop_bos

    def prompt(self, body: Mapping[str, Any]) -> str:
        prompt = render_prompt(body, self.dialect)
        return prompt.removeprefix(BOS) if self.drop_bos else prompt

    async def chat(
        self, body: dict[str, Any], *, stream: bool, history: HistoryEncoder | None = None
    ) -> TurnOutput:
        """The request rendered as a prompt (``history`` is the chat encoder's: not used)."""
        prompt = self.prompt(body)
        payload = raw_payload(self.api, prompt, body)
        out = await self._client.raw(PATHS[self.api], payload, stream=stream)
        return out if out.failure is not None else finish_raw(out, prompt)

    @property
    def request_url(self) -> str:
        return str(self._client.base_url) + PATHS[self.api]

    @property
    def key_sent(self) -> bool:
        return self._client.key_sent

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


async def check_rendering(raw: RawClient, body: dict[str, Any]) -> dict[str, Any]:
    """One turn sent both ways: the server's chat template and the harness's rendering must
    give the same ``prompt_tokens``, or the raw turns are not the chat turns.

    One token more in raw mode, on a prompt that starts with BOS, is the server adding its
    own BOS (a double BOS): ``raw.drop_bos`` is set and the turn sent again without it.
    ``{"ok": True | False | None, "chat_prompt_tokens", "raw_prompt_tokens", "drop_bos",
    "message"}``; None when the two could not be compared.
    """
    chat = await raw._client.chat(body, stream=False)
    out = await raw.chat(body, stream=False)
    result: dict[str, Any] = {
        "chat_prompt_tokens": chat.prompt_tokens,
        "raw_prompt_tokens": out.prompt_tokens,
        "drop_bos": False,
    }
    failed = chat.failure or out.failure
    if failed is not None or chat.prompt_tokens is None or out.prompt_tokens is None:
        why = str(failed) if failed is not None else "no prompt_tokens in the answers"
        return {**result, "ok": None, "message": f"raw mode: the rendering was not checked ({why})"}
    if out.prompt_tokens == chat.prompt_tokens + 1 and raw.prompt(body).startswith(BOS):
        raw.drop_bos = True
        again = await raw.chat(body, stream=False)
        if again.prompt_tokens == chat.prompt_tokens:
            return {**result, "raw_prompt_tokens": again.prompt_tokens, "drop_bos": True,
                    "ok": True, "message": (
                        "raw mode: the server adds its own BOS to a prompt; the harness leaves "
                        "its rendered BOS out (no double BOS)")}  # fmt: skip
        raw.drop_bos = False
    if out.prompt_tokens == chat.prompt_tokens:
        return {**result, "ok": True, "message": (
            f"raw mode: the rendered prompt and the server's chat template agree "
            f"({chat.prompt_tokens} prompt tokens)")}  # fmt: skip
    return {**result, "ok": False, "message": (
        f"raw mode: the prompt the harness renders is {out.prompt_tokens} tokens where the "
        f"server's chat template makes {chat.prompt_tokens} of the same turn: the raw turns are "
        "not what the chat endpoint sends the model (another chat template, system prompt or "
        "tool rendering?); compare runs with trace compare only once they agree")}  # fmt: skip
