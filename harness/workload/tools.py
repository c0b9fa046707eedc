"""The fake tool suite: deterministic results sized to a token budget.

A tool result depends only on (seed, tool kind, arguments, budget), so a session replays
exactly. Results look like what a coding agent sees (listings, source files, search hits,
test logs) and mention paths and identifiers that the next call can use.
"""

from __future__ import annotations

import functools
import hashlib
import random
from collections.abc import Callable, Iterable
from typing import Any

CHARS_PER_TOKEN = 4  # the client-side estimate; the server's usage figures are preferred

_DIRS = (
    "src/cache",
    "src/scheduler",
    "src/stream",
    "src/memory",
    "src/api",
    "src/kernels",
    "tests/cache",
    "tests/scheduler",
    "tests/stream",
    "tools",
    "docs",
)
_STEMS = (
    "pool",
    "radix_tree",
    "evict",
    "loader",
    "batch",
    "queue",
    "worker",
    "detokenizer",
    "chunker",
    "allocator",
    "index",
    "router",
    "session",
    "metrics",
    "config",
    "transfer",
    "prefetch",
    "layer_loader",
    "sparse_index",
    "topk",
)
_IDENTS = (
    "evict_lru",
    "load_back",
    "host_pool",
    "device_pool",
    "wait_layer",
    "ready_event",
    "index_k_cache",
    "alloc_slots",
    "free_slots",
    "schedule_batch",
    "prefill_chunk",
    "decode_step",
    "flush",
    "match_prefix",
    "insert_node",
    "lock_ref",
    "page_table",
    "write_through",
    "copy_stream",
    "sync_point",
    "token_budget",
    "max_total_tokens",
)
_WORDS = (
    "entry",
    "node",
    "layer",
    "batch",
    "request",
    "token",
    "page",
    "slot",
    "stream",
    "event",
    "buffer",
    "index",
    "prefix",
    "value",
    "count",
    "size",
    "state",
    "lock",
)


def estimate_tokens(text: str) -> int:
    return max(1, len(text) // CHARS_PER_TOKEN)


def _rng(seed: int, *parts: Any) -> random.Random:
    return random.Random(_draw(seed, *parts))


def _draw(seed: int, *parts: Any) -> int:
    """A 64-bit number fixed by ``(seed, *parts)``: the same in every process and run."""
    digest = hashlib.blake2b(repr((seed, *parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def _path(rng: random.Random) -> str:
    d = rng.choice(_DIRS)
    prefix = "test_" if d.startswith("tests") else ""
    return f"{d}/{prefix}{rng.choice(_STEMS)}.py"


def _code_line(rng: random.Random, indent: int) -> str:
    a, b, c = rng.choice(_IDENTS), rng.choice(_WORDS), rng.choice(_WORDS)
    shape = rng.randrange(8)
    pad = "    " * indent
    if shape == 0:
        return f"{pad}def {a}(self, {b}: int, {c}: list[int] | None = None) -> int:"
    if shape == 1:
        return f"{pad}if self.{b}_{c} is None or len(self.{b}s) > self.max_{c}:"
    if shape == 2:
        return f"{pad}self.{b}_{c} = {a}({b}, {c}={rng.randrange(1, 4096)})"
    if shape == 3:
        return f"{pad}# {b.capitalize()} {c}s are released once the {rng.choice(_WORDS)} is done."
    if shape == 4:
        return f"{pad}for {b} in self.{c}s[{rng.randrange(0, 64)}:]:"
    if shape == 5:
        return f"{pad}return {a}(self.{b}, {c})"
    if shape == 6:
        return f'{pad}logger.debug("{a}: %d {b}s", len(self.{c}s))'
    return f"{pad}{b} = self.{c}_map.get({b}_id, {rng.randrange(0, 9)})"


#: Lines in each tool kind's corpus: 8,192 lines is about 500 KB, more than an 80k-token
#: context; a longer result wraps around.
CORPUS_LINES = 8192
#: Width of a ``read_file`` line number (``{n:5d}`` and two spaces) below line 100,000.
_NUMBER_WIDTH = 7
#: Marks where a ``search`` hit carries the query.
_QUERY = "\x00"


class _Corpus:
    """Realistic lines of one tool kind, made once per process from a fixed seed.

    A result is a run of whole lines from a seeded offset (wrapping around), so it costs a
    slice and a join rather than a few random draws and an f-string per line. ``extra`` is
    the number of characters the caller adds to each line (line numbers, the query), counted
    when sizing the result.
    """

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines
        self.ends = [0]
        for line in lines:
            self.ends.append(self.ends[-1] + len(line) + 1)

    def take(self, first: int, chars: int, extra: int = 0) -> list[str]:
        """Whole lines from line ``first`` (mod the corpus size), ``chars`` characters or more."""
        n = len(self.lines)
        first %= n
        out: list[str] = []
        while True:
            ends = self.ends
            base = ends[first]
            # the fewest lines from ``first`` whose length reaches ``chars``
            lo, hi = first + 1, n
            if ends[n] - base + extra * (n - first) < chars:
                out += self.lines[first:]
                chars -= ends[n] - base + extra * (n - first)
                first = 0
                continue
            while lo < hi:
                mid = (lo + hi) // 2
                if ends[mid] - base + extra * (mid - first) >= chars:
                    hi = mid
                else:
                    lo = mid + 1
            out += self.lines[first:lo]
            return out


def _corpus_lines(kind: str, line: Any) -> list[str]:
    rng = random.Random(f"harness-tool-corpus-{kind}")
    return [line(rng, n) for n in range(CORPUS_LINES)]


@functools.cache
def _list_corpus(dirs: tuple[str, ...]) -> _Corpus:
    def entry(r: random.Random, n: int) -> str:
        return f"{dirs[n % len(dirs)]}/{r.choice(_STEMS)}_{n}.py  {r.randrange(200, 90000)} bytes"

    return _Corpus(_corpus_lines("list_dir:" + ",".join(dirs), entry))


@functools.cache
def _code_corpus() -> _Corpus:
    return _Corpus(_corpus_lines("read_file", lambda r, n: _code_line(r, 1 + (n % 3))))


@functools.cache
def _search_corpus() -> _Corpus:
    def hit(r: random.Random, n: int) -> str:
        where = f"{_path(r)}:{r.randrange(1, 2000)}"
        return f"{where}:    {_QUERY} = {r.choice(_IDENTS)}({r.choice(_WORDS)})"

    return _Corpus(_corpus_lines("search", hit))


@functools.cache
def _test_corpus() -> _Corpus:
    def case(r: random.Random, n: int) -> str:
        status = "FAILED" if r.random() < 0.08 else "PASSED"
        return f"{_path(r).replace('src/', 'tests/')}::test_{r.choice(_IDENTS)}_{n} {status}"

    return _Corpus(_corpus_lines("run_tests", case))


@functools.cache
def _echo_corpus() -> _Corpus:
    return _Corpus(
        _corpus_lines("echo", lambda r, n: f"{r.choice(_WORDS)} {r.choice(_IDENTS)} {n}")
    )


def _chars(budget_tokens: int) -> int:
    return max(40, budget_tokens * CHARS_PER_TOKEN)


def _list_dir(draw: int, args: dict[str, Any], budget: int) -> str:
    base = str(args.get("path") or ".").strip("/") or "."
    dirs = _DIRS if base == "." else tuple(d for d in _DIRS if d.startswith(base)) or _DIRS
    lines = _list_corpus(dirs).take(draw, _chars(budget))
    return f"$ ls -R {base}\n" + "\n".join(lines)


def _read_file(draw: int, args: dict[str, Any], budget: int) -> str:
    path = str(args.get("path", "src/main.py"))
    start = _int_arg(args.get("start_line"), 1)
    code = _code_corpus().take(draw, _chars(budget), _NUMBER_WIDTH)
    paths = _note_paths()
    module = paths[(draw >> 16) % len(paths)][:-3].replace("/", ".")
    ident = _IDENTS[(draw >> 40) % len(_IDENTS)]
    head = f"# {path}\nimport logging\nfrom {module} import {ident}\n"
    return head + "\n".join(map(str.__add__, _line_numbers(start, len(code)), code))


@functools.cache
def _numbered(count: int) -> list[str]:
    return [f"{n:5d}  " for n in range(1, count + 1)]


def _line_numbers(start: int, count: int) -> list[str]:
    """``{n:5d}  `` for the ``count`` lines from ``start`` (the common ones made once)."""
    made = _numbered(2 * CORPUS_LINES)
    if start + count - 1 <= len(made):
        return made[start - 1 : start - 1 + count]
    return [f"{n:5d}  " for n in range(start, start + count)]


def _search(draw: int, args: dict[str, Any], budget: int) -> str:
    query = str(args.get("query", ""))
    lines = _search_corpus().take(draw, _chars(budget), len(query) - len(_QUERY))
    return f"Matches for /{query}/:\n" + "\n".join(lines).replace(_QUERY, query)


def _run_tests(draw: int, args: dict[str, Any], budget: int) -> str:
    target = str(args.get("target", "tests"))
    body = "\n".join(_test_corpus().take(draw, _chars(budget)))
    failed = body.count("FAILED")
    return f"$ pytest {target}\n{body}\n== {failed} failed, {body.count('PASSED')} passed =="


def _echo(draw: int, args: dict[str, Any], budget: int) -> str:
    return "\n".join(_echo_corpus().take(draw, _chars(budget)))


def _int_arg(value: Any, default: int) -> int:
    """An integer argument as the model wrote it, within line numbers a file can have."""
    try:
        number = int(value) if value is not None else default
    except (TypeError, ValueError, OverflowError):
        return default
    return min(max(number, 1), 10**9)


_KINDS = {
    "list_dir": _list_dir,
    "read_file": _read_file,
    "search": _search,
    "run_tests": _run_tests,
    "echo": _echo,
}


def warm(kinds: Iterable[str], prose: bool = False) -> None:
    """Build, before a load, the corpora that the tools of ``kinds`` (and ``echo``, the kind
    of a call to an undeclared tool) and, with ``prose``, the chat workload's documents draw
    from: 25-60 ms each, on the event loop at a kind's first call otherwise, while every
    stream in flight waits. Nothing a tool returns changes (they are made once either way)."""
    made: dict[str, Callable[[], object]] = {
        "list_dir": lambda: _list_corpus(_DIRS),  # a path narrows it: those are made on use
        "read_file": _code_corpus,
        "search": _search_corpus,
        "run_tests": _test_corpus,
        "echo": _echo_corpus,
    }
    for kind in {*kinds, "echo"}:
        if kind in made:
            made[kind]()
    _numbered(2 * CORPUS_LINES)
    _note_paths()
    if prose:
        _prose_corpus()


def run_tool(kind: str, arguments: dict[str, Any], *, seed: int, budget_tokens: int) -> str:
    """The result of one fake tool call, about ``budget_tokens`` tokens long.

    The text is a run of lines of the kind's corpus from an offset fixed by the seed and the
    arguments, so the same call in the same session gives the same text in every run.
    """
    draw = _draw(seed, kind, sorted(arguments.items(), key=lambda kv: kv[0]).__repr__())
    return _KINDS[kind](draw, arguments, max(16, budget_tokens))


_SUBJECTS = (
    "The scheduler",
    "Each worker",
    "The cache pool",
    "A request",
    "The loader",
    "The host tier",
    "The router",
    "Every session",
    "The allocator",
    "The index",
)
_VERBS = ("keeps", "evicts", "reloads", "copies", "tracks", "releases", "batches", "checks")
_OBJECTS = (
    "the pages of idle sessions",
    "a prefix tree of cached tokens",
    "one slot per request",
    "the layers in order",
    "a budget of tokens per step",
    "the entries it can free",
    "the events of the copy stream",
    "the requests that wait",
)
_CLAUSES = (
    "when memory runs short",
    "before the next step starts",
    "after a transfer ends",
    "while other requests decode",
    "once the lock is released",
    "at most once per batch",
)


@functools.cache
def _prose_corpus() -> _Corpus:
    def sentence(r: random.Random, n: int) -> str:
        subject, verb = r.choice(_SUBJECTS), r.choice(_VERBS)
        text = f"{subject} {verb} {r.choice(_OBJECTS)} {r.choice(_CLAUSES)}."
        return text + ("\n" if n % 6 == 5 else "")

    return _Corpus(_corpus_lines("document", sentence))


def document_chunk(seed: int, tokens: int) -> str:
    """Deterministic prose paragraphs, about ``tokens`` tokens, for chat workloads."""
    return "\n".join(_prose_corpus().take(_draw(seed, "document"), _chars(tokens)))


def padding_text(seed: int, tokens: int) -> str:
    """Deterministic repository notes used to bring the first request to its start size.

    Each note is ``- {dir}/{stem}.py: {ident} handles the {word} {word}s.``, its five parts
    drawn as ``random.choice`` draws them (``getrandbits(n.bit_length())`` until below
    ``n``), inlined: an 80k-token prompt is 5,000 notes, and ``choice`` cost 0.9 us a note,
    5 ms a session, where one of its turns costs the harness about 1 ms. The text is the same
    as with ``choice`` (a test holds both to it), so the sessions' prompts stay what they were.
    """
    rng = _rng(seed, "padding")
    bits = rng.getrandbits
    nd, ns, ni, nw = len(_DIRS), len(_STEMS), len(_IDENTS), len(_WORDS)
    kd, ks, ki, kw = nd.bit_length(), ns.bit_length(), ni.bit_length(), nw.bit_length()
    heads, tails = _note_parts()
    target = max(40, tokens * CHARS_PER_TOKEN)
    lines: list[str] = []
    size = 0
    while size < target:
        d = bits(kd)
        while d >= nd:
            d = bits(kd)
        s = bits(ks)
        while s >= ns:
            s = bits(ks)
        i = bits(ki)
        while i >= ni:
            i = bits(ki)
        a = bits(kw)
        while a >= nw:
            a = bits(kw)
        b = bits(kw)
        while b >= nw:
            b = bits(kw)
        text = heads[(d * ns + s) * ni + i] + tails[a * nw + b]
        lines.append(text)
        size += len(text) + 1
    return "\n".join(lines)


@functools.cache
def _note_paths() -> tuple[str, ...]:
    """Every ``{dir}/{stem}.py`` (``test_{stem}.py`` under tests/) the notes can name."""
    return tuple(
        f"{d}/{'test_' if d.startswith('tests') else ''}{s}.py" for d in _DIRS for s in _STEMS
    )


@functools.cache
def _note_parts() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Every ``- {path}: {ident} handles the `` and every ``{word} {word}s.`` of a note."""
    heads = tuple(f"- {p}: {i} handles the " for p in _note_paths() for i in _IDENTS)
    return heads, tuple(f"{a} {b}s." for a in _WORDS for b in _WORDS)
