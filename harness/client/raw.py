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
from harness.dialects.prompt_v4 import END_THINK, THINK, render_v4, render_v32
from harness.errors import UsageError

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
    """The request of ``api`` for ``prompt`` with the chat body's sampling settings."""
    sampling = {k: body[k] for k in ("temperature", "max_tokens", "seed") if k in body}
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
    """The client as the sessions see it in raw mode: ``chat(body)`` sends the rendered prompt."""

    def __init__(self, client: ChatClient, api: str, dialect: str) -> None:
        check_api(api, dialect)
        self._client = client
        self.api = api
        self.dialect = dialect

    async def chat(self, body: dict[str, Any], *, stream: bool) -> TurnOutput:
        prompt = render_prompt(body, self.dialect)
        payload = raw_payload(self.api, prompt, body)
        out = await self._client.raw(PATHS[self.api], payload, stream=stream)
        return out if out.failure is not None else finish_raw(out, prompt)

    @property
    def request_url(self) -> str:
        return str(self._client.base_url) + PATHS[self.api]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)
