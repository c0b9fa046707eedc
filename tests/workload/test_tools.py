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


def test_read_file_numbers_lines_from_the_asked_start() -> None:
    text = run_tool("read_file", {"path": "src/a.py", "start_line": 40}, seed=2, budget_tokens=400)
    numbers = [int(m) for m in re.findall(r"^\s*(\d+)  ", text, re.M)]
    assert numbers[:3] == [40, 41, 42]
    assert numbers == list(range(40, 40 + len(numbers)))


@pytest.mark.parametrize("kind", ["list_dir", "read_file", "search", "run_tests", "echo"])
def test_results_longer_than_the_corpus_keep_their_size(kind: str) -> None:
    # a result past the corpus's length wraps around instead of stopping short
    budget = 3 * tools.CORPUS_LINES * 60 // tools.CHARS_PER_TOKEN
    text = run_tool(
        kind, {"path": "src", "query": "q", "target": "t"}, seed=1, budget_tokens=budget
    )
    assert 0.95 * budget <= estimate_tokens(text) <= 1.1 * budget


def test_search_hits_carry_the_query_and_arguments_change_the_text() -> None:
    a = run_tool("search", {"query": "load_back"}, seed=5, budget_tokens=300)
    b = run_tool("search", {"query": "evict_lru"}, seed=5, budget_tokens=300)
    assert a.count("load_back") >= a.count("\n")
    assert "\x00" not in a
    assert a != b
    summary = run_tool("run_tests", {"target": "tests"}, seed=5, budget_tokens=300).splitlines()[-1]
    assert re.fullmatch(r"== \d+ failed, \d+ passed ==", summary)


def test_a_model_written_start_line_never_breaks_the_tool() -> None:
    for value in ("12", "x", -5, 10**30, None, 2.5):
        text = run_tool("read_file", {"path": "p", "start_line": value}, seed=1, budget_tokens=50)
        assert text.startswith("# p\n")


def test_warm_builds_the_corpora_a_load_would_build_on_its_loop() -> None:
    """``warm`` (before a load) builds the corpora of the kinds asked, and echo's (a call to
    an undeclared tool), not the others; the results are the ones built on first use."""
    args = {"path": "src/a.py", "query": "evict"}
    before = {k: run_tool(k, args, seed=5, budget_tokens=400) for k in ("read_file", "search")}
    builders = (tools._code_corpus, tools._search_corpus, tools._echo_corpus, tools._test_corpus)
    for cached in (*builders, tools._prose_corpus):
        cached.cache_clear()
    tools.warm(["read_file", "search"])
    made = [cached.cache_info().currsize for cached in builders]
    assert made == [1, 1, 1, 0]
    assert tools._prose_corpus.cache_info().currsize == 0
    tools.warm([], prose=True)
    assert tools._prose_corpus.cache_info().currsize == 1
    after = {k: run_tool(k, args, seed=5, budget_tokens=400) for k in ("read_file", "search")}
    assert after == before
