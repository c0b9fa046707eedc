"""The first pass never hides evidence; the newer signals fire on their corruption and stay
quiet on the clean look-alikes; broken envelopes are left to the dialects."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from harness.verdict import classify_text
from harness.verdict.detector import masking, repeat, salad
from harness.verdict.detector import text as text_mod
from harness.verdict.detector.text import score_text
from tools.detector import corruptgen

EVAL = Path(__file__).resolve().parent.parent / "data" / "eval"
PROSE = (
    "The migration has three steps. First, we add the new column with a default value so "
    "that existing rows stay valid. Second, a background job copies the old values into the "
    "new column in small batches, which keeps the table available. "
)


def _rows() -> list[dict[str, str]]:
    rows = []
    for name in ("handwritten.jsonl", "generated.jsonl"):
        rows += [json.loads(x) for x in (EVAL / name).read_text("utf-8").splitlines()]
    return rows


def _corrupted_plain_texts() -> list[dict[str, str]]:
    """Fresh corruptions (tools/detector/corruptgen.py, two seeds) of the plain seeds: the
    cases the first pass must not wave through."""
    seeds = [r for r in _rows() if r["id"].startswith("hw-") and r["label"] == "clean"]
    return [r for s in (7, 8) for r in corruptgen.generate(seeds, s, 4)]


def test_first_pass_only_passes_texts_without_any_event() -> None:
    passed = 0
    for row in _rows() + _corrupted_plain_texts():
        work = text_mod._unescape(row["text"])
        if text_mod.quick_clean(work):
            passed += 1
            full = text_mod._score(work, row.get("context"))
            assert full.score == 0.0, (row["id"], full)
    assert passed >= 10  # the first pass is exercised, not vacuous


@pytest.mark.parametrize(
    "text",
    [
        PROSE,
        "Sure — here’s the summary you asked for: the job finished in 3.2 s.",
        "Something without a notebook is like a database without a timeout.",
    ],
)
def test_first_pass_accepts_plain_prose(text: str) -> None:
    assert text_mod.quick_clean(text)
    assert score_text(text).label is None


@pytest.mark.parametrize(
    "text",
    [
        PROSE + "<|im_start|>",
        PROSE + "!!!!!!!!",
        PROSE + "word?other",
        PROSE + PROSE,  # repeated trigrams: the loop search decides
        PROSE + "call setUpMANAGER now",
        "Привет " + PROSE,  # a non-ASCII letter: scripts are read by the full path
    ],
)
def test_first_pass_sends_anything_suspicious_on(text: str) -> None:
    assert not text_mod.quick_clean(text)


GLUED_SOUP = (
    "Das Wort ist ein Beispiel für die deutsche Sprache und war bekannt. "
    "eineDas wiewie Beispielfür Sprachedeutsche warbekannt ist ein wie eine das wort"
)


def test_glued_words_of_the_text_itself() -> None:
    assert len(repeat.glued(repeat.tokenize(GLUED_SOUP))) >= 3
    assert text_mod.rules(GLUED_SOUP).label == "token_salad"
    assert score_text(GLUED_SOUP).label == "token_salad"
    # a compound whose parts also stand alone is one event, not salad
    single = PROSE + "Nothing is something, and some thing is not nothing at all."
    assert text_mod.rules(single).label is None
    assert score_text(single).label is None


@pytest.mark.parametrize(
    ("text", "label"),
    [
        ("Thành phố nổi tiếng búnbúnbúnbúnbúnbúnbún", "repetition"),
        ("हिंदी सबसे एकएकएकएकएकएकएकएकएकएक", "repetition"),
        ("Haha, that was good. hahaha! Ok ok.", None),
        pytest.param(
            PROSE + "|\n" * 16,
            "repetition",
            marks=pytest.mark.xfail(
                strict=True,
                reason="known regression of the fitted decision: a lone mark repeated on 16 "
                "lines after clean prose, P(corrupted) 0.98 under the threshold that applies "
                "when the rules fired (docs/detector.md); the rules find it",
            ),
        ),
        (PROSE + "\U0001f602 " * 12, "repetition"),
        ("Results\n- - - - - - - - - - - -\nall good", None),  # a rule drawn with spaces
    ],
)
def test_loops_the_word_tokenizer_cannot_see(text: str, label: str | None) -> None:
    assert score_text(text).label == label


def test_replacement_characters_count_inside_quotes_and_code() -> None:
    assert score_text("Use `fo\ufffd\ufffd\ufffdo` here.").label == "token_salad"
    assert score_text("```\nx = 1\ufffd\ufffd\ufffd\n```").label == "token_salad"


def test_one_end_of_turn_token_at_the_end_is_not_debris() -> None:
    assert score_text("Done.<|im_end|>").label is None
    assert score_text("Done.</s>").label is None
    assert score_text("Done.<|im_end|> And more text here.").label == "token_salad"


def test_soup_between_two_dollars_is_not_math() -> None:
    soup = "Cost: $0&q_UwoKem?ONRYGUz(w[D16Na`A(Sb^:TS-''$ total"
    assert score_text(soup).label == "token_salad"
    assert score_text(r"Solve $x^2 - 4x + 4 = 0$ for $x$.").label is None


def test_a_repeated_formula_is_a_loop() -> None:
    formula = "$$x_{1,2}=\\frac{-b\\pm\\sqrt{b^2-4ac}}{2a}.$$\n\n"
    assert score_text("The roots are\n\n" + formula * 6).label == "repetition"


CALL = '{"name": "read_file", "arguments": {"path": "src/main.py", "limit": 40}}'
ENVELOPES = [
    ("json-concat", CALL * 3),
    ("hermes-concat", f"<tool_call>\n{CALL}{CALL}{CALL}\n</tool_call>"),
    ("hermes-broken-then-eos", '<tool_call>\n{"name": "f", "arguments": {"a": 1}\n<|im_end|>'),
    ("ascii-bar-dsml", '<|DSML|tool_calls>\n<|DSML|invoke name="shell">\n</|DSML|invoke>'),
    ("bare-invoke-json", 'Checking.\n\n<invoke name="get_weather">\n{"city": "Paris"}\n</invoke>'),
]


@pytest.mark.parametrize("text", [c[1] for c in ENVELOPES], ids=[c[0] for c in ENVELOPES])
def test_broken_envelopes_are_malformed_calls_not_salad_or_loops(text: str) -> None:
    assert score_text(text).label is None  # the markup itself is not salad or a loop
    assert classify_text(text).label == "malformed_tool_call"


def test_salad_inside_concatenated_calls_is_still_read() -> None:
    salad_call = CALL.replace("src/main.py", "вывод_handlerULATE 性能zá strSQLат廣 buildersкой")
    assert score_text(salad_call + salad_call).label == "token_salad"


def test_chars_classes_match_the_bytes() -> None:
    ch = salad.Chars("a?B é")
    assert ch.cls("glue").tolist() == [False, True, False, False, False]
    assert ch.cls("letter_or_wide").tolist() == [True, False, True, False, True]
    assert ch.wide.tolist() == [4]


@pytest.mark.parametrize(
    "text",
    ["ΟΔΟΣ σοφία ΣΟΦΙΑ", "Übergröße ÜBER über", "Ǆemal ǅemal džemal", "数据Row ΑΣ row"],
)
def test_token_ids_hash_what_str_lower_gives(text: str) -> None:
    # the lower-case table must agree with str.lower, final sigma included
    assert (repeat.tokenize(text).ids == repeat.tokenize(text.lower()).ids).all()


def test_a_lower_case_that_grows_leaves_the_text_as_it_is() -> None:
    ids = repeat.tokenize("İstanbul Ab ab").ids  # "İ".lower() is two characters
    assert ids[1] != ids[2]
    assert repeat.tokenize("Istanbul Ab ab").ids[1] == repeat.tokenize("x ab").ids[1]


@pytest.mark.parametrize(
    "text",
    [
        "Costs $5 and $6, see \\(x\\) and $$y$$ and \\[z\\].",
        "$a\\(b$ c\\)",  # the two parts' matches overlap: the whole pattern decides
        "\\[x $y\\] $",
        "paths /usr/lib/x and C:\\Users\\me\\x and a/b",
        "/a/b\\c/d",
    ],
)
def test_a_pattern_split_by_its_first_character_matches_as_the_whole(text: str) -> None:
    for whole, parts in (
        (masking._MATH, masking._MATH_BY_LEAD),
        (masking._PATH, masking._PATH_BY_LEAD),
    ):
        got = [m.span() for m in masking._by_lead(whole, parts, text)]
        assert got == [m.span() for m in whole.finditer(text)]


def test_four_grams_from_three_grams_are_the_four_gram_hashes() -> None:
    ids = np.random.default_rng(0).integers(0, 2**63, 50, dtype=np.uint64)
    longer = repeat._grams_longer(repeat._grams(ids, 3), ids, 3)
    assert (longer == repeat._grams(ids, 4)).all()


def test_scores_are_the_same_in_every_process() -> None:
    """The signals' sums are added in a fixed order, not in set order (which follows the
    hash seed): the same text gets the same score, to the last digit, in any process."""
    import subprocess

    script = (
        "import json, sys\n"
        "from harness.verdict.detector.text import score_text\n"
        "rows = [json.loads(x) for x in sys.stdin]\n"
        "print(json.dumps([score_text(r['text'], r.get('context')).score for r in rows]))\n"
    )
    data = "".join(json.dumps(r) + "\n" for r in _rows())
    outs = set()
    for seed in ("1", "2", "3"):
        proc = subprocess.run(
            [sys.executable, "-c", script],
            input=data,
            capture_output=True,
            text=True,
            env={"PYTHONHASHSEED": seed, "PATH": ""},
            cwd=Path(__file__).resolve().parent.parent.parent,
            timeout=120,
            check=True,
        )
        outs.add(proc.stdout)
    assert len(outs) == 1


def test_the_rules_find_a_lone_mark_repeated_on_its_own_lines() -> None:
    # the fitted decision misses this one (marked above); the rules' char_run sees it
    assert text_mod.rules(PROSE + "|\n" * 16).label == "repetition"
