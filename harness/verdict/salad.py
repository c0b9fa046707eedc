"""Salad events found with regular expressions: each is (position, weight, signal).

Weights are in units of the detection threshold (1.0): one event of weight 1.0 is enough on
its own; weaker events must meet others in the same window. Positions are character offsets.
Every pattern is a compiled regex scanned once over the text: linear time, no Python loop
over characters.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

Event = tuple[int, float, str]

#: Special tokens of chat templates and tokenizers that never belong in visible content.
_SPECIAL = re.compile(
    r"<\|(?:im_start|im_end|im_sep|endoftext|end_of_text|begin_of_text|eot_id|eom_id"
    r"|start_header_id|end_header_id|fim_prefix|fim_middle|fim_suffix|endofprompt|pad"
    r"|assistant|user|system|end|start|return|call|channel|message|constrain)\|>"
    r"|<\uff5c(?!DSML\uff5c)[^\uff5c<>\n]{1,40}\uff5c>"  # DeepSeek fullwidth-bar tokens
    r"|</?think>|<unk>|<pad>|<mask>|<bos>|<eos>|<start_of_turn>|<end_of_turn>"
    r"|\[(?:PAD|UNK|CLS|SEP|MASK)\]|<<SYS>>|<</SYS>>|\[/?INST\]"
    r"|<extra_id_\d+>|<\|reserved_special_token_\d+\|>|<0x[0-9A-F]{2}>"
)
_FFFD = re.compile("\ufffd+")
#: One character repeated: punctuation and symbols (not the ones markdown and ASCII art
#: draw lines with), letters of any script, or spaceless-script characters.
_RUN = re.compile(r"([^\s\-=_*#~.·─━═+|/\\<>`'\"0-9])\1{3,}")
_ASCII_SOUP = re.compile(r"(?:[A-Za-z0-9]{0,5}[!-/:-@\[-`{-~]){10,}[A-Za-z0-9]{0,5}")
_REGEX_LIKE = re.compile(r"\\[dwsDWSbB.]|\[\^?[^\]]{1,40}\]|\(\?[:=!<]|\{\d+(?:,\d*)?\}")
_SOUP_NORMAL = set('{}[]":,.-_/')
#: Sentence punctuation glued between two letters ("doubts?只", "i#else").
_GLUED = re.compile(r"(?<=[^\W\d_])[?!;#~](?=[^\W\d_])")
#: An ASCII symbol inside a run of spaceless-script letters ("的$的").
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7a3\u0e00-\u0e7f"
_SANDWICH = re.compile(f"(?<=[{_CJK}])[?!;#~$@^\\\\|&*=+%](?=[{_CJK}])")
#: Two different clause marks touching ("?;", ",:"): no writing system puts them together.
_CLASH = re.compile(r"(?<![?!;:,.])(?:[?!][;:,]|[;:,][?!;:,])(?![?!;:,.])")
#: Lower-case letters followed by upper-case ones to the end of the word ("bolE",
#: "ManagerULATE"): tokenizer pieces glued, outside code.
_CASE = re.compile(r"(?<![A-Za-z])[A-Za-z]?[a-z]{2,}[A-Z]+(?![A-Za-z])|[a-z][A-Z]{3,}")
#: Three or more spaceless-script characters each doubled in a row ("的的是是在在").
_DOUBLED = re.compile(f"(?:([{_CJK}])\\1){{3,}}")
#: A syllable doubled inside a word ("overwardwardwards").
_STUTTER = re.compile(r"([^\W\d_]{3,8})\1(?=[^\W\d_])", re.I)
#: The same word twice in a row ("side side").
_DOUBLE_WORD = re.compile(r"\b([^\W\d_]{2,})\s+\1\b")


def special_tokens(text: str) -> Iterator[tuple[int, int, str]]:
    for m in _SPECIAL.finditer(text):
        yield m.start(), m.end(), m.group(0)


def events(text: str, ascii_only: bool) -> Iterator[Event]:
    """Salad events of ``text`` (already masked: code, URLs and markup are blanks)."""
    if "\ufffd" in text:
        for m in _FFFD.finditer(text):
            yield m.start(), min(1.5, 0.6 * (m.end() - m.start())), "replacement_char"
    for m in _RUN.finditer(text):
        n = m.end() - m.start()
        ch = m.group(1)
        if ch.isalnum():  # letters: "AAAAAAA", "加加加加"; words of one letter repeated are rare
            w = (n - 3) / 5 if ch.isascii() else (n - 2) / 6
        else:
            w = (n - 2) / 4
        yield m.start(), min(w, 3.0), "char_run"
    for m in _ASCII_SOUP.finditer(text):
        s = m.group(0)
        punct = {c for c in s if not c.isalnum()}
        odd = punct - _SOUP_NORMAL
        if len(s) >= 16 and len(punct) >= 6 and len(odd) >= 4 and len(_REGEX_LIKE.findall(s)) < 2:
            yield m.start(), min(1.5, len(s) / 24 * len(odd) / 6), "symbol_soup"
    for m in _GLUED.finditer(text):
        yield m.start(), 0.4, "glued_punctuation"
    if not ascii_only:
        for m in _SANDWICH.finditer(text):
            yield m.start(), 0.6, "stray_symbol"
    for m in _CLASH.finditer(text):
        yield m.start(), 0.4, "stray_symbol"
    for m in _CASE.finditer(text):
        yield m.start(), 0.3, "identifier_soup"
    for m in _STUTTER.finditer(text):
        yield m.start(), 0.35, "stutter"
    if not ascii_only:
        for m in _DOUBLED.finditer(text):
            yield m.start(), (m.end() - m.start()) / 4 - 0.5, "stutter_run"
    for m in _DOUBLE_WORD.finditer(text):
        yield m.start(), 0.25, "stutter"
