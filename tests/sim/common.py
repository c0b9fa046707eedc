"""Tools and a tiny session driver shared by the sim tests."""

from __future__ import annotations

from typing import Any

import httpx

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "list_dir",
            "description": "List a directory.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string", "description": "Directory path."}},
                "required": ["path"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file.",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "File path."},
                    "start_line": {"type": "integer", "minimum": 1},
                    "max_lines": {"type": "integer", "minimum": 1, "maximum": 2000},
                },
                "required": ["path", "max_lines"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the code.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string"},
                    "mode": {"type": "string", "enum": ["regex", "literal"]},
                    "case_sensitive": {"type": "boolean"},
                    "globs": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
                    "window": {
                        "type": "object",
                        "properties": {
                            "before": {"type": "integer", "minimum": 0, "maximum": 10},
                            "after": {"type": "integer", "minimum": 0, "maximum": 10},
                        },
                        "required": ["before", "after"],
                    },
                },
                "required": ["query", "mode", "window"],
                "additionalProperties": False,
            },
        },
    },
]

SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}

FILES = [
    "src/cache/pool.py",
    "src/cache/loader.py",
    "src/sched/queue.py",
    "src/sched/batch.py",
    "tests/cache/test_pool.py",
    "docs/design.md",
]


def tool_result(turn: int) -> str:
    """A fake tool result mentioning paths and identifiers."""
    a, b = FILES[turn % len(FILES)], FILES[(turn + 3) % len(FILES)]
    return (
        f"{a}:10: def evict_entry(self, key):\n{b}:42: class LayerLoader:\n"
        f"    wait_for_layer(layer_id)\n    self.index_k_cache = allocate_pool(size)\n"
    )


TASK = "Find the race in the cache. Work in about 4 steps."


def messages(task: str = TASK) -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "You are a careful engineer."},
        {"role": "user", "content": task},
    ]


def chat(client: httpx.Client, msgs: list[dict[str, Any]], **extra: Any) -> httpx.Response:
    body = {"model": "m", "messages": msgs, "tools": TOOLS, "max_tokens": 1024, **extra}
    return client.post("/v1/chat/completions", json=body)


def follow(msgs: list[dict[str, Any]], message: dict[str, Any], turn: int) -> None:
    """Append the assistant message and one tool result per call, as an agent client does."""
    msgs.append(
        {"role": "assistant", "content": message["content"], "tool_calls": message["tool_calls"]}
    )
    for call in message["tool_calls"]:
        msgs.append({"role": "tool", "tool_call_id": call["id"], "content": tool_result(turn)})
