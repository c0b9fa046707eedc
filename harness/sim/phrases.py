"""The prose of the scripted agent: preambles before tool calls, final answers, chat replies.

Clean, varied English that names the paths and identifiers of the session; no sentence
template is used twice in one answer, so clean output never looks like a loop. Final answers
and chat replies also carry real text: passages of Python's own reference documentation
(``pydoc_data.topics``, shipped with the interpreter: prose, grammar, tables, code), so that
the text detector's false alarms on the simulator's healthy answers measure something.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from functools import cache

from harness.dialects.base import ToolCall
from harness.sim.args import Seen

_OPENERS = ["Let me", "Now let me", "Next, I'll", "I'll", "To check this, let me", "I want to"]
_PURPOSES = [
    "see how {topic} works",
    "check where {topic} is handled",
    "understand the control flow around {topic}",
    "confirm what the previous result suggested about {topic}",
    "compare it with what I found so far",
    "find the code paths that touch {topic}",
    "see whether {topic} is guarded by a lock",
    "check how {topic} is initialized",
    "narrow down where {topic} changes",
    "see which callers rely on {topic}",
    "look for the place where {topic} is released",
]


def _first_string(call: ToolCall) -> str | None:
    for value in call.arguments.values():
        if isinstance(value, str) and value:
            return value
    return None


def _action(call: ToolCall) -> str:
    name = call.name.lower()
    target = _first_string(call)
    shown = f"`{target}`" if target and " " not in target else (target or "the repository")
    if "list" in name or name.endswith("dir") or "tree" in name:
        return f"list {'the repository root' if target == '.' else shown}"
    if re.search(r"read|open|view|cat", name):
        return f"read {shown}"
    if re.search(r"search|grep|find", name):
        return f"search for {shown}"
    if re.search(r"test", name):
        return f"run the tests in {shown}"
    if re.search(r"run|exec|shell", name):
        return f"run {shown}"
    return f"call {call.name} on {shown}"


def preamble(rng: random.Random, calls: Sequence[ToolCall], seen: Seen) -> str:
    """One sentence announcing the calls, e.g. "Let me read src/a.py to see how X works."."""
    topic = rng.choice(seen.identifiers[-10:]) if seen.identifiers else "the code"
    if seen.identifiers and rng.random() < 0.5:
        topic = f"`{topic}`"
    purpose = rng.choice(_PURPOSES).format(topic=topic)
    actions = " and ".join(_action(c) for c in calls)
    if not seen.files and not seen.dirs and calls and "list" in calls[0].name.lower():
        return rng.choice(
            [
                f"Let me start by getting an overview: I'll {actions}.",
                f"First I'll {actions} to see how the project is organized.",
            ]
        )
    if rng.random() < 0.1:
        return ""
    return f"{rng.choice(_OPENERS)} {actions} to {purpose}."


_FINAL = [
    "I went through {done} tool results to trace this.",
    "The relevant code lives in {f1}, with supporting pieces in {f2}.",
    "{i1} is where the behaviour is decided, and {i2} feeds it the state it reads.",
    "The results show that {i2} is updated without waiting for {i1} to finish, which explains "
    "the intermittent failures.",
    "The tests I looked at exercise {i1} only with a single request at a time, so they do not "
    "catch the interleaving.",
    "{f2} sizes its buffers once at start-up and never revisits that decision.",
    "I would fix it by making {i1} wait for the pending update, then add a test that runs "
    "several requests concurrently.",
    "Nothing in {f1} suggests a second cause; the other call sites of {i2} look correct.",
]

_CHAT = [
    "You asked about {w1}, so here is how I would approach it.",
    "The short answer is that {w1} depends mostly on {w2}.",
    "In practice, {w2} is the part that tends to go wrong first, especially under load.",
    "A good first step is to measure {w1} on a small example before changing anything.",
    "If {w3} is involved as well, keep it separate so that each change can be tested on its own.",
    "Most of the time the simplest explanation holds: look at recent changes to {w2}.",
    "Once that works, the same approach extends to {w3} without much extra effort.",
    "Let me know if you want me to go through {w1} in more detail.",
    "There are two common pitfalls here: assuming {w2} is stable, and testing {w3} only once.",
]


@cache
def _passages() -> tuple[str, ...]:
    """Paragraphs of 120 to 1,500 characters of Python's reference documentation."""
    try:
        from pydoc_data.topics import topics
    except ImportError:  # an interpreter built without its documentation
        return ()
    out = []
    for _, text in sorted(topics.items()):
        for para in re.split(r"\n\s*\n", text):
            para = para.strip()
            if 120 <= len(para) <= 1500:
                out.append(para)
    return tuple(out)


def passage(rng: random.Random, most: int = 2) -> str:
    """One to ``most`` consecutive paragraphs of real documentation ("" without any)."""
    paras = _passages()
    if not paras:
        return ""
    start = rng.randrange(len(paras))
    return "\n\n".join(paras[start : start + rng.randint(1, most)])


def _fill(rng: random.Random, templates: Sequence[str], n: int, **slots: str) -> list[str]:
    return [t.format(**slots) for t in rng.sample(list(templates), min(n, len(templates)))]


def final_answer(rng: random.Random, seen: Seen, done: int) -> str:
    files = seen.files[-8:] or seen.dirs[-8:] or ["the repository"]
    idents = seen.identifiers[-12:] or ["the main loop", "the shared state"]
    slots = {
        "done": str(done),
        "f1": f"`{rng.choice(files)}`",
        "f2": f"`{rng.choice(files)}`",
        "i1": f"`{rng.choice(idents)}`",
        "i2": f"`{rng.choice(idents)}`",
    }
    sentences = _fill(rng, _FINAL[:1], 1, **slots) + _fill(
        rng, _FINAL[1:], rng.randint(3, 5), **slots
    )
    notes = passage(rng)
    return " ".join(sentences) + (
        f"\n\nFor reference, from the documentation:\n\n{notes}" if notes else ""
    )


def chat_answer(rng: random.Random, last_user: str) -> str:
    words = [w.lower() for w in re.findall(r"[A-Za-z][A-Za-z-]{4,}", last_user)]
    words = list(dict.fromkeys(words)) or ["this question", "the setup", "the details"]
    slots = {f"w{i}": rng.choice(words) for i in (1, 2, 3)}
    paragraphs = []
    order = rng.sample(_CHAT, len(_CHAT))
    for _ in range(rng.randint(1, 3)):
        take, order = order[: rng.randint(2, 3)], order[3:]
        if not take:
            break
        paragraphs.append(" ".join(t.format(**slots) for t in take))
    notes = passage(rng, 3)
    return "\n\n".join([paragraphs[0], notes, *paragraphs[1:]] if notes else paragraphs)
