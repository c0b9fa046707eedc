"""Render an OpenAI chat message list (+ tools) to the exact DeepSeek V4 / V3.2 prompt text.

``render_v4`` reproduces DeepSeek's V4 encoder byte for byte on its published examples:
the system prompt (with the tool section appended), ``<｜User｜>`` turns, tool results
folded into a user turn as ``<tool_result>`` blocks, ``<｜Assistant｜>`` followed by
``<think>`` (thinking mode, from the last user turn on) or ``</think>``, earlier reasoning
dropped, assistant calls re-encoded as canonical DSML, ``<｜end▁of▁sentence｜>`` after each
assistant turn. ``render_v32`` follows DeepSeek's V3.2 reference encoder (tool results as
``<function_results>`` after the end-of-turn token).

A prompt that ends with a user or tool turn ends with the generation header, ready for the
model to continue.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from harness.dialects.dsml import encode_block
from harness.dialects.dsml_grammar import EOS, MARK
from harness.errors import UsageError

BOS = "<\uff5cbegin\u2581of\u2581sentence\uff5c>"
USER = "<\uff5cUser\uff5c>"
ASSISTANT = "<\uff5cAssistant\uff5c>"
THINK, END_THINK = "<think>", "</think>"
#: ``action`` follows the generation header; the other tasks replace it.
TASKS = ("action", "query", "authority", "domain", "title", "read_url")

V4_TOOLS_TEMPLATE = (
    "## Tools\n\nYou have access to a set of tools to help answer the user's question. "
    f'You can invoke tools by writing a "<{MARK}tool_calls>" block like the following:\n\n'
    f"<{MARK}tool_calls>\n"
    f'<{MARK}invoke name="$TOOL_NAME">\n'
    f'<{MARK}parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE'
    f"</{MARK}parameter>\n...\n</{MARK}invoke>\n"
    f'<{MARK}invoke name="$TOOL_NAME2">\n...\n</{MARK}invoke>\n'
    f"</{MARK}tool_calls>\n\n"
    'String parameters should be specified as is and set `string="true"`. For all other '
    "types (numbers, booleans, arrays, objects), pass the value in JSON format and set "
    '`string="false"`.\n\n'
    "If thinking_mode is enabled (triggered by <think>), you MUST output your complete "
    "reasoning inside <think>...</think> BEFORE any tool calls or final response.\n\n"
    "Otherwise, output directly after </think> with tool calls or final response.\n\n"
    "### Available Tool Schemas\n\n{schemas}\n\n"
    "You MUST strictly follow the above defined tool name and parameter schemas to invoke "
    "tool calls.\n"
)

V32_TOOLS_TEMPLATE = (
    "## Tools\nYou have access to a set of tools you can use to answer the user's question.\n"
    f'You can invoke functions by writing a "<{MARK}function_calls>" block like the '
    "following as part of your reply to the user:\n"
    f"<{MARK}function_calls>\n"
    f'<{MARK}invoke name="$FUNCTION_NAME">\n'
    f'<{MARK}parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE'
    f"</{MARK}parameter>\n...\n</{MARK}invoke>\n"
    f'<{MARK}invoke name="$FUNCTION_NAME2">\n...\n</{MARK}invoke>\n'
    f"</{MARK}function_calls>\n"
    "String and scalar parameters should be specified as is without any escaping or quotes, "
    'while lists and objects should use JSON format. The "string" attribute should be set '
    'to "true" for string type parameters and "false" for other types (numbers, booleans, '
    "arrays, objects).\n"
    "If the thinking_mode is enabled, then after function results you should strongly "
    "consider outputting a thinking block. Here is an example:\n"
    f"<{MARK}function_calls>\n...\n</{MARK}function_calls>\n"
    "<function_results>\n...\n</function_results>\n"
    f"{THINK}...thinking about results{END_THINK}\n"
    "Here are the functions available in JSONSchema format:\n<functions>\n{schemas}\n"
    "</functions>\n"
)


def _tool_schemas(tools: Sequence[Mapping[str, Any]]) -> str:
    out = []
    for tool in tools:
        fn = tool.get("function", tool)
        out.append(json.dumps(fn, ensure_ascii=False))
    return "\n".join(out)


def _text(content: Any) -> str:
    """Message content as text (a list of parts is joined)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, Mapping))
    raise UsageError(f"message content must be a string or a list of parts, not {content!r}")


def _calls(msg: Mapping[str, Any]) -> list[dict[str, Any]]:
    calls = []
    for call in msg.get("tool_calls") or []:
        fn = call.get("function", call)
        args = fn.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError as exc:
                raise UsageError(f"tool call arguments are not JSON: {args!r}") from exc
        if not isinstance(args, dict):
            raise UsageError(f"tool call arguments must be a JSON object: {args!r}")
        calls.append({"name": fn["name"], "arguments": args})
    return calls


def _prepare(
    messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None
) -> list[dict[str, Any]]:
    msgs = [dict(m) for m in messages]
    if tools:
        idx = next((i for i, m in enumerate(msgs) if m.get("role") == "system"), None)
        if idx is None:
            msgs.insert(0, {"role": "system", "content": ""})
            idx = 0
        msgs[idx]["tools"] = list(tools)
    for m in msgs:
        if "role" not in m:
            raise UsageError(f"message without a role: {m!r}")
    return msgs


def _last_user(msgs: Sequence[Mapping[str, Any]]) -> int:
    return max((i for i, m in enumerate(msgs) if m["role"] in ("user", "developer")), default=-1)


def _auto_thinking(msgs: Sequence[Mapping[str, Any]], thinking: bool | None) -> bool:
    if thinking is not None:
        return thinking
    return any(m.get("reasoning_content") for m in msgs if m["role"] == "assistant")


def _assistant(msg: Mapping[str, Any], think: bool, version: str) -> str:
    reasoning = (_text(msg.get("reasoning_content")) + END_THINK) if think else ""
    calls = _calls(msg)
    block = "\n\n" + encode_block(calls, version) if calls else ""
    return reasoning + _text(msg.get("content")) + block + EOS


def _ordered_results(msgs: list[dict[str, Any]], i: int) -> tuple[list[str], int]:
    """The tool messages starting at ``i``, ordered like the calls of the assistant before."""
    j = i
    while j < len(msgs) and msgs[j]["role"] == "tool":
        j += 1
    group = msgs[i:j]
    prev = next((m for m in reversed(msgs[:i]) if m["role"] == "assistant"), None)
    ids = [c.get("id") for c in (prev or {}).get("tool_calls") or []]
    if all(m.get("tool_call_id") in ids for m in group) and None not in ids:
        group = sorted(group, key=lambda m: ids.index(m.get("tool_call_id")))
    return [_text(m.get("content")) for m in group], j


def render_v4(
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    *,
    thinking: bool | None = None,
) -> str:
    """The DeepSeek V4 prompt for ``messages``.

    ``tools`` (OpenAI definitions) join the system message (one is added when missing);
    tools may also sit on a system, developer or user message as ``"tools"``.
    ``thinking``: thinking mode; None means "when any assistant message has
    ``reasoning_content``". A user message with ``"task"`` gets that task's token.
    """
    msgs = _prepare(messages, tools)
    think = _auto_thinking(msgs, thinking)
    last_user = _last_user(msgs)
    out = [BOS]

    def header(idx: int, task: str | None = None) -> str:
        if task is not None and task not in TASKS:
            raise UsageError(f"unknown task {task!r}: use one of {', '.join(TASKS)}")
        if task is not None and task != "action":
            return f"<\uff5c{task}\uff5c>"
        text = ASSISTANT + (THINK if think and idx >= last_user else END_THINK)
        return text + ("<\uff5caction\uff5c>" if task == "action" else "")

    i = 0
    while i < len(msgs):
        m = msgs[i]
        role = m["role"]
        tools_text = ""
        if m.get("tools"):
            tools_text = "\n\n" + V4_TOOLS_TEMPLATE.replace("{schemas}", _tool_schemas(m["tools"]))
        if role == "system":
            out.append(_text(m.get("content")) + tools_text)
        elif role in ("user", "developer"):
            out.append(USER + _text(m.get("content")) + tools_text + header(i, m.get("task")))
        elif role == "latest_reminder":
            out.append(f"<\uff5clatest_reminder\uff5c>{_text(m.get('content'))}")
        elif role == "tool":
            results, j = _ordered_results(msgs, i)
            text = "\n\n".join(f"<tool_result>{r}</tool_result>" for r in results)
            if j < len(msgs) and msgs[j]["role"] == "user":  # folded into the next user turn
                text += "\n\n" + _text(msgs[j].get("content"))
                j += 1
            out.append(USER + text + header(j - 1))
            i = j
            continue
        elif role == "assistant":
            out.append(_assistant(m, think and i > last_user, "v4"))
        else:
            raise UsageError(f"unknown message role {role!r}")
        i += 1
    return "".join(out)


def render_v32(
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    *,
    thinking: bool | None = None,
) -> str:
    """The DeepSeek V3.2 prompt for ``messages`` (tool results as ``<function_results>``)."""
    msgs = _prepare(messages, tools)
    think = _auto_thinking(msgs, thinking)
    last_user = _last_user(msgs)
    out = [BOS]
    for i, m in enumerate(msgs):
        role = m["role"]
        content = _text(m.get("content"))
        tools_text = ""
        if m.get("tools"):
            tools_text = "\n\n" + V32_TOOLS_TEMPLATE.replace("{schemas}", _tool_schemas(m["tools"]))
        think_tok = THINK if think and i == last_user else END_THINK
        if role == "system":
            out.append(content + tools_text)
        elif role == "developer":
            body = tools_text + f"\n\n# The user's message is: {content}"
            out.append(USER + body + ASSISTANT + think_tok)
        elif role == "user":
            out.append(USER + content + ASSISTANT + think_tok)
        elif role == "tool":
            k = i
            while k > 0 and msgs[k - 1]["role"] == "tool":
                k -= 1
            order = i - k + 1
            n_calls = len(_calls(msgs[k - 1])) if k > 0 else 0
            if k == 0 or msgs[k - 1]["role"] != "assistant" or order > n_calls:
                raise UsageError(f"tool message {i} does not answer an assistant tool call")
            piece = (
                "\n\n<function_results>" if order == 1 else ""
            ) + f"\n<result>{content}</result>"
            if order == n_calls:
                piece += "\n</function_results>\n\n"
                piece += THINK if think and i >= last_user else END_THINK
            out.append(piece)
        elif role == "assistant":
            out.append(_assistant(m, think and i > last_user, "v32"))
        else:
            raise UsageError(f"unknown message role {role!r}")
    return "".join(out)
