"""Soup at the end of fluent prose (``detector.soup``): corrupt tails written for these tests,
and the healthy text that looks like them (regexes, passwords and keys where they are shown,
blobs, URLs, minified code, tables, identifiers, commands, other languages)."""

from __future__ import annotations

import pytest

from harness.dialects import registry
from harness.dialects.base import ToolCall
from harness.verdict import classify_turn
from harness.verdict.detector import soup
from harness.verdict.detector.fitted import model
from harness.verdict.detector.fitted.charmodel import CharModel
from harness.verdict.detector.fitted.wordmodel import WordModel
from harness.verdict.detector.text import TOKEN_SALAD, score_text


def _models() -> tuple[CharModel, WordModel]:
    fitted = model.load()
    return fitted.chars, fitted.words


_PROSE = (
    "Bread rises because yeast eats the sugars in the flour and gives off carbon dioxide. "
    "The gas is trapped by a stretchy network of gluten, which forms when the dough is "
)

#: (prose, soup): the soup starts right after a word of the prose and runs to the end.
CORRUPT = [
    # a run of random printable characters
    (_PROSE + "kneaded and", "Z7}q'Lr!x(Vd>m#2wK^e%Pb~`tS@"),
    (
        "A linked list stores its items in nodes that point to the next node, which makes "
        "insertion at the front fast. Finding an item means walking the list from",
        "c$H8)jQ[w;fN!uRk=Y]e^3*",
    ),
    # capitalised word-pieces
    (_PROSE + "worked by", "sloTHE BRUMAKEN warmthIN glutERS,oven DOUGHRISEN RiseO"),
    # lower-case sub-word pieces glued without their boundaries
    (_PROSE + "mixed with", "waterkn'ead aof glutenthminationrb RBS-Cs ais oveNbakewh"),
    # pieces with marks and digits glued in
    (_PROSE + "left in", "ove3ns rest(ing bakeR,lo doughy:kne fl0ur"),
    # the text's own words shuffled, some glued together, some with a piece written twice
    (
        _PROSE + "kneaded in",
        "yeast gas the offcarbon sugars flour, when by network rises the stretchy isdough "
        "which glutluten trapped the eatsflour gives inthe dioxide. forms mixed yeastthe when",
    ),
]

HEALTHY = [
    # a regex and a password shown in backticks or in a code block
    "To match an email address you can use a pattern like this one, which is good enough "
    "for most forms: `^[\\w.+-]+@[\\w-]+\\.[\\w.]+$`",
    "To match an email address you can use this pattern, which is good enough for most "
    "forms:\n\n```\n^[a-zA-Z0-9._%+-]+@[a-zA-Z0-9.-]+\\.[a-zA-Z]{2,}$\n```",
    "Here is a strong random password that you can use for the new account on the staging "
    "server: `q7#Lm!2x$Vb@9Zr^Tk&4`",
    "Set the new password in the environment of the service like this:\n"
    "PASSWORD='xK9#mQ2$vL7!pR4&'",
    # a base64 blob, a hex digest, a URL with a query string, a JWT
    "The file is encoded in base64 and the header of the payload that the client sends "
    "looks like dGhpcyBpcyBhIHRlc3Qgb2YgdGhlIGJhc2U2NCBlbmNvZGluZyBvZiBhIGZpbGU=",
    "The checksum of the archive should match the one published on the website, "
    "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
    "You can download the latest release of the tool from the project page at "
    "https://example.com/download?version=2.4.1&os=linux&arch=x86_64#checksums",
    "The request carries the session token in its header, and the token looks like "
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0",
    # minified code, markup, a command
    "The bundle contains the minified code, which looks like this in the browser "
    '!function(e,t){"object"==typeof exports&&"undefined"!=typeof module?module.exports=t()'
    ":e.Vue=t()}(this,function(){return 1});",
    "The template now renders the message in a box with the style from the theme, as "
    '<div class="note">Saved!</div>',
    "To install the dependencies and run the tests, open a terminal in the project "
    "directory and type npm install && npm run build -- --watch --mode=production",
    "Use the following command to find large files in the directory and list them "
    "find . -type f -size +100M -exec ls -lh {} \\; | awk '{ print $9 \": \" $5 }'",
    # a table, a key in a config line
    "Here is the comparison of the two plans that you asked about:\n\n"
    "| Plan | Price | Storage |\n|------|-------|---------|\n| Basic | $5/mo | 10 GB |\n"
    "| Pro | $15/mo | 100 GB |",
    "To configure the client, put the key in your environment file like this:\n"
    "OPENAI_API_KEY=sk-proj-Ab3dE5fG7hI9jK1lM3nO5pQ7rS9tU1vW3xY5zA7bC9dE",
    # lists of identifiers and names
    "The module exports the following functions that you can call from your code "
    "getUserById setUserName fetchDataFromServer parseConfigFile validateInput",
    "I have updated the configuration so that the worker reads its settings from the new "
    "file. The relevant keys are maxRetries, backoffMs, jitterPct",
    "The test runner printed the names of the failing cases in the log of the nightly job "
    "testParseHeaderWithEmptyValue testRoundTripUTF8 testLargePayloadChunked",
    "The longest place name in Wales is the village usually shortened to Llanfair PG, whose "
    "full name is Llanfairpwllgwyngyllgogerychwyrndrobwllllantysiliogogogoch",
    # CJK and mixed-language prose
    "我已经修改了配置文件，现在服务器会在启动时读取新的设置，"
    "并且日志会写入 logs/server.log 文件中。",
    "Your order has been placed and will arrive on Friday. Thank you for shopping with us! "
    "Muchas gracias por su paciencia y que tenga un excelente dia",
    "The report was sent to the whole team this morning, as we agreed yesterday. Terima "
    "kasih atas bantuannya, semoga harimu menyenangkan selalu",
    "In Mandarin, a simple greeting you can use with your new colleagues is ni hao, and to "
    "thank someone you say xiexie nin, or duoxie",
    # compounds and glued names of the text's own words, in sentences
    "Delete the lock file and run the install again: the lockfile is rebuilt from the "
    "manifest, and the runbooks describe how the file server and the build server share "
    "the cache, so the fileserver and the buildserver never rebuild the same lockfile twice "
    "after a release",
    # ordinary prose that ends in words
    "The main character of the story is a young girl named Xiomara who lives with her "
    "grandmother in a small village near the sea.",
]


@pytest.mark.parametrize(("prose", "tail"), CORRUPT)
def test_soup_after_prose_is_salad(prose: str, tail: str) -> None:
    text = prose + " " + tail
    assert soup.tail(text, *_models()) == len(prose) + 1
    found = score_text(text)
    assert found.label == TOKEN_SALAD
    assert found.offset is not None
    assert found.offset >= len(prose) - 40
    assert classify_turn(text, source="server").corrupted


@pytest.mark.parametrize("prose", [p for p, _ in CORRUPT])
def test_the_prose_alone_is_clean(prose: str) -> None:
    text = prose + " the loaf."
    assert soup.tail(text, *_models()) is None
    assert not classify_turn(text, source="server").corrupted


@pytest.mark.parametrize("text", HEALTHY)
def test_healthy_look_alikes_have_no_soup_tail(text: str) -> None:
    assert soup.tail(text, *_models()) is None
    assert "soup_tail" not in score_text(text).signals


@pytest.mark.parametrize(
    "where",
    [
        "```\n{tail}\n```",  # in a code block
        "`{tail}`",  # in a code span
        '"{tail}"',  # quoted
    ],
)
def test_the_same_soup_shown_as_code_is_no_tail(where: str) -> None:
    prose, tail = CORRUPT[0]
    text = prose + " " + where.format(tail=tail)
    assert soup.tail(text, *_models()) is None


@pytest.mark.parametrize("name", sorted(set(registry.names()) - {"auto", "json", "none"}))
def test_a_tool_call_after_prose_is_no_soup(name: str) -> None:
    # the parsers judge the markup; its names and arguments glued to the prose are no soup
    calls = [ToolCall("get_weather", {"city": "Tokyo", "units": "metric"})]
    prose = "" if name.startswith("llama") else "Let me check the weather in the city for you."
    text = registry.get(name).encode(prose, calls)
    assert soup.tail(text, *_models()) is None
    assert not classify_turn(text, source="raw", dialect=name).corrupted


def test_soup_after_a_colon_is_shown_not_read() -> None:
    # what follows a colon is a value on show (a key, a password, a line of code)
    text = _PROSE + "kneaded, as follows: Z7}q'Lr!x(Vd>m#2wK^e%Pb~`tS@"
    assert soup.tail(text, *_models()) is None


def test_soup_after_prose_in_another_language_is_left_alone() -> None:
    # the lexicon is English: before the tail, the text must be English prose
    text = (
        "Perfecto, ya he actualizado la prioridad de tu interconsulta y ahora necesito "
        "consultar los cupos disponibles para la semana siguiente en el hospital "
        "waterkn'ead aof glutenforming thoveness rbreadaste"
    )
    assert soup.tail(text, *_models()) is None


@pytest.mark.parametrize(
    ("token", "noise"),
    [
        ("$IEPSH'd~Pgmq|jb>!&]/p?e(unee=N", True),
        ("Z7}q'Lr!x(Vd>m#2wK^e%Pb~", True),
        ("^(?=.*[A-Z])(?=.*\\d).{8,}$", False),  # a regex: its brackets pair up
        ("{'retries':3,'backoff':[1,2,4]}", False),  # a literal: the same
        ("https://example.com/search?q=a+b&page=2#top", False),
        ('class="note">Saved!</div>', False),  # markup
        ("dGhpcyBpcyBhIHRlc3Qgb2YgdGhlIGJhc2U2NA==", False),  # base64: few marks
        ("q7#Lm!2x$Vb", False),  # short
        ("s%3AxK9_mQ2.vL7-pR4aBcD", False),  # a cookie's value: four kinds of marks
        ("abc.DEF-ghi_JKL~mnopqrs", False),
    ],
)
def test_noise_run(token: str, noise: bool) -> None:
    assert soup.noise_run(token) is noise
