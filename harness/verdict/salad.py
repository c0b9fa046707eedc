"""Salad events: each is (position, weight, signal). Positions are character offsets.

Weights are on the scale of ``text.THRESHOLD`` (0.7): one event of weight 1.0 is enough on
its own; weaker events must meet others in the same window. Patterns are compiled regexes
scanned once, or numpy comparisons over the code points (runs, stutters, case changes) whose
few hits are then checked: linear time, no Python loop over characters.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import numpy as np
import numpy.typing as npt

Event = tuple[int, float, str]

#: Special tokens of chat templates and tokenizers that never belong in visible content.
SPECIAL = re.compile(
    r"<\|(?:im_start|im_end|im_sep|endoftext|end_of_text|begin_of_text|eot_id|eom_id"
    r"|start_header_id|end_header_id|fim_prefix|fim_middle|fim_suffix|endofprompt|pad"
    r"|assistant|user|system|end|start|return|call|channel|message|constrain)\|>"
    r"|<\uff5c(?!DSML\uff5c)[^\uff5c<>\n]{1,40}\uff5c>"  # DeepSeek fullwidth-bar tokens
    r"|</?think>|</?s>|<unk>|<pad>|<mask>|<bos>|<eos>|<start_of_turn>|<end_of_turn>"
    r"|\[(?:PAD|UNK|CLS|SEP|MASK)\]|<<SYS>>|<</SYS>>|\[/?INST\]"
    r"|<extra_id_\d+>|<\|reserved_special_token_\d+\|>|<0x[0-9A-F]{2}>"
)
_FFFD = re.compile("\ufffd+")
#: One character repeated: punctuation and symbols (not the ones markdown and ASCII art
#: draw lines with), letters of any script, or spaceless-script characters.
_RULE_CHARS = set("-=_*#~.·─━═+|/\\<>`'\"")
_ASCII_SOUP = re.compile(r"(?:[A-Za-z0-9]{0,6}[!-/:-@\[-`{-~]){6,}[A-Za-z0-9]{0,6}")
_REGEX_LIKE = re.compile(r"\\[dwsDWSbB.]|\[\^?[^\]]{1,40}\]|\(\?[:=!<]|\{\d+(?:,\d*)?\}")
_SOUP_NORMAL = set('{}[]":,.-_/')
#: Sentence punctuation glued between two letters ("doubts?只", "i#else").
_GLUED = re.compile(r"[?!;#~](?=[^\W\d_])")
#: An ASCII symbol inside a run of spaceless-script letters ("的$的").
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7a3\u0e00-\u0e7f"
_SANDWICH = re.compile(f"(?<=[{_CJK}])[?!;#~$@^\\\\|&*=+%](?=[{_CJK}])")
#: Two different clause marks touching ("?;", ",:"): no writing system puts them together.
_CLASH = re.compile(r"[?!][;:,]|[;:,][?!;:,]")
_CLAUSE = set("?!;:,.")
#: Lower-case letters followed by upper-case ones to the end of the word ("bolE",
#: "ManagerULATE"): tokenizer pieces glued, outside code.
_CASE = re.compile(r"(?<![A-Za-z])[A-Za-z]?[a-z]{2,}[A-Z]+(?![A-Za-z])|[a-z][A-Z]{3,}")
#: Three or more spaceless-script characters each doubled in a row ("的的是是在在").
_DOUBLED = re.compile(f"(?:([{_CJK}])\\1){{3,}}")
#: A syllable doubled inside a word ("overwardwardwards").
_STUTTER = re.compile(r"([^\W\d_]{3,8})\1(?=[^\W\d_])", re.I)
#: The same word twice in a row ("side side").
_DOUBLE_WORD = re.compile(r"\b([^\W\d_]{2,})\s+\1\b")
_ADJ = re.compile(r"(\w\w)\s+\1")


_EOS_END = re.compile("<\uff5cend\u2581of\u2581sentence\uff5c>\\s*\\Z")


def special_tokens(text: str) -> Iterator[tuple[int, int, str]]:
    """Special tokens in ``text``; DeepSeek's end-of-turn token at the very end is normal."""
    eos = _EOS_END.search(text)
    for m in SPECIAL.finditer(text):
        if eos is None or m.start() != eos.start():
            yield m.start(), m.end(), m.group(0)


def _runs(mask: npt.NDArray[np.bool_], min_len: int) -> list[tuple[int, int]]:
    """(start, end) of the runs of True in ``mask`` at least ``min_len`` long."""
    if min_len > 1:  # cheap rejection: is there any window of min_len Trues at all?
        if mask.size < min_len:
            return []
        c = np.cumsum(mask, dtype=np.int32)
        if int((c[min_len - 1 :] - np.concatenate(([0], c[: -min_len]))).max()) < min_len:
            return []
    elif not mask.any():
        return []
    d = np.diff(np.concatenate(([0], mask.view(np.int8), [0])))
    st, en = np.flatnonzero(d == 1), np.flatnonzero(d == -1)
    keep = (en - st) >= min_len
    return list(zip(st[keep].tolist(), en[keep].tolist(), strict=True))


def events(text: str, ascii_only: bool) -> Iterator[Event]:
    """Salad events of ``text`` (already masked: code, URLs and markup are blanks)."""
    codes = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    if codes.size < 2:
        return
    if "\ufffd" in text:
        for m in _FFFD.finditer(text):
            yield m.start(), min(1.5, 0.6 * (m.end() - m.start())), "replacement_char"
    # runs of one character: equal neighbours, vectorized; the few runs found are checked
    for s, e in _runs(codes[1:] == codes[:-1], 3):
        ch, n = text[s], e - s + 1
        if ch.isspace() or ch.isdigit() or ch in _RULE_CHARS:
            continue
        # letters ("AAAAAAA", "加加加加") need longer runs than punctuation ("!!!!")
        w = ((n - 3) / 5 if ch.isascii() else (n - 2) / 6) if ch.isalnum() else (n - 2) / 4
        if w > 0:
            yield s, min(w, 3.0), "char_run"
    # symbol soup: only where ASCII punctuation is dense
    punct = ((codes >= 33) & (codes <= 47)) | ((codes >= 58) & (codes <= 64))
    punct |= ((codes >= 91) & (codes <= 96)) | ((codes >= 123) & (codes <= 126))
    if punct.sum() >= 5:
        c = np.concatenate(([0], np.cumsum(punct)))
        w16 = min(16, codes.size)
        dense = (c[w16:] - c[:-w16]) >= 5
        for s, e in _runs(dense, 1):
            yield from _soup(text, max(0, s - 8), min(len(text), e + w16 + 8))
    for m in _GLUED.finditer(text):
        i = m.start()
        if i > 0 and _is_letter(text[i - 1]):
            yield i, 0.4, "glued_punctuation"
    if not ascii_only:
        for m in _SANDWICH.finditer(text):
            yield m.start(), 0.6, "stray_symbol"
    for m in _CLASH.finditer(text):
        i, j = m.start(), m.end()
        if (i == 0 or text[i - 1] not in _CLAUSE) and (j >= len(text) or text[j] not in _CLAUSE):
            yield i, 0.4, "stray_symbol"
    # lower-case letter followed by an upper-case one: check only those spots
    low = (codes >= 97) & (codes <= 122)
    up = (codes >= 65) & (codes <= 90)
    last = -1
    for i in np.flatnonzero(low[:-1] & up[1:]).tolist():
        if i < last:
            continue
        cm = _CASE.search(text, max(0, i - 12), min(len(text), i + 40))
        if cm is not None and cm.start() <= i + 1 < cm.end():
            last = cm.end()
            yield cm.start(), 0.3, "identifier_soup"
    # a syllable of 3 to 8 letters doubled inside a word
    is_letter = _letter_mask(codes)
    for k in range(3, 9):
        if codes.size <= 2 * k:
            break
        eq = (codes[k:] == codes[:-k]) & is_letter[k:] & is_letter[:-k]
        for s, e in _runs(eq, k):
            if e + k < len(text) and _is_letter(text[e + k]) and len(set(text[s : s + k])) > 1:
                yield s, 0.35, "stutter"
    if not ascii_only:
        for m in _DOUBLED.finditer(text):
            yield m.start(), (m.end() - m.start()) / 4 - 0.5, "stutter_run"
    if _ADJ.search(text):
        for m in _DOUBLE_WORD.finditer(text):
            yield m.start(), 0.25, "stutter"


def _soup(text: str, lo: int, hi: int) -> Iterator[Event]:
    for m in _ASCII_SOUP.finditer(text, lo, hi):
        s = m.group(0)
        punct = {c for c in s if not c.isalnum()}
        odd = punct - _SOUP_NORMAL
        if len(s) >= 16 and len(punct) >= 5 and len(odd) >= 3 and len(_REGEX_LIKE.findall(s)) < 2:
            yield m.start(), min(1.5, len(s) / 20 * len(odd) / 5), "symbol_soup"


def _is_letter(ch: str) -> bool:
    return ch.isalpha()


def _letter_mask(codes: npt.NDArray[np.uint32]) -> npt.NDArray[np.bool_]:
    ascii_letter = ((codes >= 65) & (codes <= 90)) | ((codes >= 97) & (codes <= 122))
    return ascii_letter | (codes >= 0xC0)
