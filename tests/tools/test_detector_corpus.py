"""The corpus builder's parts (tools.detector): the tokenizer, splits by group, corruption."""

from __future__ import annotations

import random

import pytest

from tools.detector import answer_like, corruption, splits, tokenizer
from tools.detector import corpus as cb


@pytest.fixture(scope="module")
def tk() -> tokenizer.Tokenizer:
    from harness.servers.llamacpp import default_model

    return tokenizer.Tokenizer(tokenizer.gguf_tokens(default_model()))


def test_tokenizer_round_trips_any_script(tk: tokenizer.Tokenizer) -> None:
    for text in ("Hello, world!", "Été à Paris — 你好世界, Привет", "def f(x):\n    return x"):
        pieces = tk.encode(text)
        assert len(pieces) < len(text.encode("utf-8"))  # real merges, not bytes
        assert tk.decode(pieces) == text


def test_splits_are_by_group_and_stable() -> None:
    assert splits.split_of("pypkg:numpy") == splits.split_of("pypkg:numpy")
    got = {splits.split_of(f"pypkg:p{i}") for i in range(200)}
    assert got == {"ngram", "train", "val", "test"}


def test_chunks_have_answer_sizes() -> None:
    text = "\n".join(f"Line {i} of a long document about nothing much." for i in range(400))
    rng = random.Random(0)
    for _ in range(20):
        for c in answer_like.chunks(text, rng, 3):
            assert answer_like.MIN_LEN <= len(c) <= answer_like.MAX_LEN


def test_corruptions_change_the_text_and_carry_a_label(tk: tokenizer.Tokenizer) -> None:
    rng = random.Random(3)
    pools = corruption.script_pools(tk)
    a = "Köln ist eine Stadt am Rhein. Sie hat einen großen Dom und viele Brücken.\n" * 3
    b = "The quick brown fox jumps over the lazy dog while the cat sleeps on the mat."
    kinds = set()
    for _ in range(300):
        got = corruption.corrupt(rng, a, b, tk, pools)
        if got is None:
            continue
        label, kind, text = got
        kinds.add(kind)
        assert label in ("salad", "repetition")
        assert text != a
        if kind == "mojibake":
            assert "Ã" in text
        if kind == "truncate":
            assert "\ufffd" in text
    assert len(kinds) >= 12


def test_augment_corrupts_only_the_splits_it_fits_on() -> None:
    text = (
        "The scheduler keeps one queue per worker and moves a task to another worker "
        "only when its own queue is empty, so most tasks run where they were created."
    )
    rows = [
        dict(
            id=f"c{k}",
            source="pypkg",
            group=f"pypkg:p{k % 4}",
            split=split,
            label="clean",
            kind="doc",
            text=text.replace("one", f"{k} of the"),
        )
        for k, split in enumerate(["ngram", "train", "val", "test"] * 6)
    ]
    got = list(cb.augment(rows, 7))
    assert got == list(cb.augment(rows, 7))  # seeded
    made = {r["split"] for r in got}
    assert made <= {"ngram", "train"}
    assert made == {"ngram", "train"}
    assert {r["label"] for r in got} <= {"salad", "repetition"}
    n_train = sum(r["split"] == "train" for r in got)
    assert n_train <= cb.AUGMENT["train"] * 6
    assert all(r["text"] != text for r in got)
