from __future__ import annotations

import re

import pytest

from harness.workload import tools
from harness.workload.tools import estimate_tokens, padding_text, run_tool


@pytest.mark.parametrize("kind", ["list_dir", "read_file", "search", "run_tests", "echo"])
def test_results_are_deterministic_and_sized(kind: str) -> None:
    args = {"path": "src/cache", "query": "evict_lru", "target": "tests"}
    a = run_tool(kind, args, seed=7, budget_tokens=3000)
    b = run_tool(kind, args, seed=7, budget_tokens=3000)
    c = run_tool(kind, args, seed=8, budget_tokens=3000)
    assert a == b
    assert a != c
    assert 2800 <= estimate_tokens(a) <= 3300


def test_results_mention_paths_a_next_call_can_use() -> None:
    listing = run_tool("list_dir", {"path": "."}, seed=1, budget_tokens=500)
    assert re.search(r"src/\w+/\w+\.py", listing)


def test_padding_is_the_text_random_choice_draws() -> None:
    # the notes are drawn inline for speed; the text must stay what choice() gives, or every
    # session's prompt (and the simulator's seeded faults with it) would change
    def reference(seed: int, tokens: int) -> str:
        rng = tools._rng(seed, "padding")
        lines: list[str] = []
        size = 0
        while size < max(40, tokens * tools.CHARS_PER_TOKEN):
            d = rng.choice(tools._DIRS)
            path = f"{d}/{'test_' if d.startswith('tests') else ''}{rng.choice(tools._STEMS)}.py"
            ident = rng.choice(tools._IDENTS)
            a, b = rng.choice(tools._WORDS), rng.choice(tools._WORDS)
            lines.append(f"- {path}: {ident} handles the {a} {b}s.")
            size += len(lines[-1]) + 1
        return "\n".join(lines)

    for seed in range(12):
        for tokens in (16, 300, 2000, 20000):
            assert padding_text(seed, tokens) == reference(seed, tokens)


def test_padding_reaches_its_size() -> None:
    text = padding_text(3, 1500)
    assert 1400 <= estimate_tokens(text) <= 1700
