"""Degenerate text: multi-script token salad, special-token debris and repetition loops.

Built from pools of tokenizer-like pieces (Latin subwords, Cyrillic, CJK, Arabic and other
scripts, code identifiers, punctuation, special tokens). Each salad draws its own mixing
profile, glues pieces inside words, lets a few attractor tokens recur and drops in debris,
so no two outputs look alike and none looks like one fixed string.
"""

from __future__ import annotations

import random

from harness.dialects.dsml import EOS


def _words(text: str) -> list[str]:
    return text.split()


LATIN = _words(
    "ing tion ment ULATE ached carrier hed apse ptr Impl ized ular ograph ener resp rend quir "
    "aset ordin ksz ção ität über ños ström ově ąż ville berg ness ably ify ocker ucci wijk "
    "anth opol ternal ructor ixel ulk orm ead ister otta ensch ugh"
)
CYRILLIC = _words("для ого ать ение прав ский ния ост каз вер ств ами тель щий ую Пр эт ваш ыва")
CJK = _words(
    "コンテンツ 的 数据 廣 する 関数 中 されて ている 処理 个 是 在 设置 问题 返回 缓存 し な ます "
    "생성 하는 에서 데이터 們 體 號"
)
ARABIC = _words("الم ية على في من ات تم ال ين هذا")
OTHER = _words("τη ου ματ של ים การ ที่ के में ები ութ")
CODE = _words(
    "UserManager constexpr HTML strSQL __init__ nullptr getElementById ArrayList std:: -> self. "
    "useState NSString Async Builder _ptr impl EXPECT_EQ QString onClick RuntimeException "
    "fmt.Println $this np. dtype kwargs Handler Factory .get( )) </div> {{ ::iterator "
    "addEventListener ToString() assertEqual"
)
PUNCT = list(".,\";()@59F:][{}*#=\\/%~'`") + ["...", "--", "];", '("', "\\n"]
SPECIAL = [
    "</think>",
    "<\uff5cbegin\u2581of\u2581sentence\uff5c>",
    "<|im_start|>",
    "<|im_end|>",
    "<unk>",
    "<\uff5cUser\uff5c>",
    "<\uff5cAssistant\uff5c>",
    "<|endoftext|>",
    "\ufffd",
]
POOLS = {
    "latin": LATIN,
    "cyrillic": CYRILLIC,
    "cjk": CJK,
    "arabic": ARABIC,
    "other": OTHER,
    "code": CODE,
    "punct": PUNCT,
}


def _profile(rng: random.Random) -> dict[str, float]:
    """Pool weights for one salad: mostly multi-script, sometimes monolingual."""
    r = rng.random()
    if r < 0.05:
        return {"latin": 1.0, "code": 0.6}
    if r < 0.08:
        return {"punct": 1.0, "latin": 0.1}
    if r < 0.11:
        return {"cjk": 1.0, "punct": 0.1}
    names = rng.sample(list(POOLS), rng.randint(3, len(POOLS)))
    return {name: rng.uniform(0.3, 1.0) for name in names}


def salad(rng: random.Random, n_chars: int, debris: float = 0.04) -> str:
    """About ``n_chars`` characters of token salad."""
    profile = _profile(rng)
    names, weights = list(profile), list(profile.values())
    attractors = [rng.choice(POOLS[rng.choice(names)]) for _ in range(rng.randint(1, 3))]
    out: list[str] = []
    size = 0
    while size < n_chars:
        r = rng.random()
        if r < debris:
            word = rng.choice(SPECIAL)
        elif r < debris + 0.08:
            word = rng.choice(attractors)
        else:
            pieces = rng.choices(names, weights, k=rng.choices((1, 2, 3, 4), (3, 4, 2, 1))[0])
            word = "".join(rng.choice(POOLS[p]) for p in pieces)
            if rng.random() < 0.05 and word[-1:].isalpha():
                word += str(rng.randint(0, 9))
        sep = rng.choices((" ", "", "\n", ", ", "_"), (60, 20, 5, 5, 3))[0]
        out.append(word + sep)
        size += len(word) + len(sep)
    return "".join(out)[:n_chars]


def debris_run(rng: random.Random) -> str:
    """A burst of special-token debris: end-of-thinking, repeated BOS, chat tokens, U+FFFD."""
    parts = [
        "</think>",
        SPECIAL[1] * rng.randint(2, 5),
        rng.choice(["<|im_start|>assistant", "<|im_start|>", "<\uff5cAssistant\uff5c>"]),
        "\ufffd" * rng.randint(2, 7),
        rng.choice(["<unk><unk>", "<|endoftext|>", "<\uff5cUser\uff5c>", ""]),
    ]
    rng.shuffle(parts)
    return "".join(parts)


def cut_point(rng: random.Random, text: str, lo: float, hi: float, eos: str = EOS) -> int:
    """A position in ``text`` (less its end-of-turn ``eos``) between fractions ``lo`` and
    ``hi``, often at a word boundary."""
    body = text.removesuffix(eos) if eos else text
    pos = int(len(body) * rng.uniform(lo, hi))
    if rng.random() < 0.5:
        space = body.rfind(" ", 0, pos)
        if space > 0:
            pos = space + 1
    return max(1, min(pos, len(body)))


_LOOP_FILLERS = [
    "Let me check the file again.",
    "I need to look at this more carefully.",
    "Wait, let me re-read the previous result.",
    "Actually, let me verify that first.",
]


def repetition(rng: random.Random, seed_text: str, words: list[str], n_chars: int) -> str:
    """``n_chars`` of a loop: a phrase, a line, an alternation, a cycle or a drifting clause."""
    style = rng.choice(["phrase", "line", "alternate", "cycle", "drift", "period1"])
    sentence = seed_text.strip().split("\n")[0][:160] or rng.choice(_LOOP_FILLERS)
    if style == "phrase":
        unit = rng.choice([sentence, rng.choice(_LOOP_FILLERS)]) + " "
        text = unit * (n_chars // max(1, len(unit)) + 1)
    elif style == "line":
        unit = rng.choice(_LOOP_FILLERS + [sentence]) + "\n"
        text = unit * (n_chars // len(unit) + 1)
    elif style == "alternate":
        a, b = rng.sample(_LOOP_FILLERS, 2)
        unit = f"{a}\n{b}\n"
        text = unit * (n_chars // len(unit) + 1)
    elif style == "cycle":
        lines = rng.sample(_LOOP_FILLERS, 3) + [sentence]
        unit = "\n".join(lines) + "\n\n"
        text = unit * (n_chars // len(unit) + 1)
    elif style == "drift":
        text = _drift(rng, words or ["cache", "entry", "pool", "request"], n_chars)
    else:
        unit = rng.choice(["!", " a", " the", "for ", "<unk>", " ."])
        text = unit * (n_chars // len(unit) + 1)
    return text[:n_chars]


def _drift(rng: random.Random, words: list[str], n_chars: int) -> str:
    """A clause that mutates slowly: no exact period, few distinct n-grams."""
    nouns = [w.strip("`") for w in words[:6]] + ["entry", "pool", "lock"]
    verbs = ["evicts", "reloads", "updates", "reads", "waits for"]
    clause = ["the", rng.choice(nouns), rng.choice(verbs), "the", rng.choice(nouns)]
    out: list[str] = []
    size = 0
    while size < n_chars:
        if rng.random() < 0.3:
            i = rng.choice([1, 2, 4])
            clause[i] = rng.choice(verbs if i == 2 else nouns)
        piece = " ".join(clause) + rng.choice([" and ", " when ", ", so ", " because "])
        out.append(piece)
        size += len(piece)
    return "".join(out)
