"""The corpus's clean sources: what is installed here (every Python distribution, pydoc
pages and ``--help`` screens, locale data) and the operating system's documentation, as
``(group, kind, text)``; what is left out as label noise is counted in ``EXCLUDED``.
"""

from __future__ import annotations

import gettext
import gzip
import importlib.metadata as md
import random
import re
import struct
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

from tools.detector.splits import split_of

CODE_EXT = {
    ".py": "python",
    ".pyi": "python",
    ".c": "c",
    ".h": "c",
    ".js": "javascript",
    ".css": "css",
    ".html": "html",
    ".json": "json",
    ".toml": "toml",
    ".yaml": "yaml",
    ".yml": "yaml",
    ".cfg": "ini",
}
DOC_EXT = {".md", ".rst", ".txt"}
MAX_FILES = 400  # code files, document files per group


def _read(p: Path) -> str | None:
    try:
        raw = p.read_bytes()
    except OSError:
        return None
    if p.suffix == ".gz":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError):
            return None
    if len(raw) > 2_000_000 or b"\0" in raw[:4096]:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _po_text(text: str) -> str:
    """A .po catalog as the translations it holds (msgstr values, one per line)."""
    out = []
    for m in re.finditer(r'^msgstr(?:\[\d\])? ((?:".*"\n?)+)', text, re.M):
        s = "".join(re.findall(r'"(.*)"', m.group(1)))
        s = s.replace("\\n", "\n").replace('\\"', '"').replace("\\t", "\t")
        if s and not s.startswith("Project-Id-Version"):
            out.append(s)
    return "\n".join(out)


def _lang_of(p: Path) -> str:
    parts = p.parts
    if "locale" in parts:
        i = parts.index("locale")
        if i + 1 < len(parts):
            return parts[i + 1]
    return p.stem


def pypkg_texts(rng: random.Random) -> Iterator[tuple[str, str, str]]:
    """(group, kind, text) of every installed distribution and of the standard library."""
    seen: set[str] = set()
    dists = sorted(md.distributions(), key=lambda d: d.metadata["Name"] or "")
    for d in dists:
        name = (d.metadata["Name"] or "").lower()
        if not name or name in seen or name == "harness":
            continue
        seen.add(name)
        desc = d.metadata.get_payload() or d.metadata.get("Description") or ""  # type: ignore[attr-defined]
        if desc:
            yield f"pypkg:{name}", "metadata", desc
        files = [Path(str(d.locate_file(f))) for f in (d.files or [])]
        yield from _files(f"pypkg:{name}", files, rng)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = [p for p in stdlib.rglob("*") if "site-packages" not in p.parts]
    yield from _files("pypkg:stdlib", files, rng)


#: Directories and files of test suites: they keep deliberately broken text as fixtures
#: (garbled encodings, mail test data with mojibake, truncated or shuffled input), which is
#: not clean text however clean the package is.
_TEST_DIRS = frozenset({"test", "tests", "testing", "idle_test", "testdata", "test_data"})
#: A chunk that says it holds garbled text holds an example of it (``_GIBBERISH = "..."``).
GARBLED = re.compile(r"gibberish|garbage|mojibake|nonsense", re.I)
EXCLUDED: dict[str, int] = {"test-suite files": 0, "chunks that say they are garbled": 0}


def _fixture(p: Path) -> bool:
    return (
        not _TEST_DIRS.isdisjoint(p.parts)
        or p.name.startswith("test_")
        or p.stem.endswith("_test")
        or p.name == "conftest.py"
    )


def _files(group: str, files: list[Path], rng: random.Random) -> Iterator[tuple[str, str, str]]:
    records = [f for f in files if f.name == "RECORD"]  # file names, sizes, base64 hashes
    files = [f for f in files if f.suffix in CODE_EXT or f.suffix in DOC_EXT or f.suffix == ".po"]
    n = len(files)
    files = [f for f in files if not _fixture(f)]
    EXCLUDED["test-suite files"] += n - len(files)
    rng.shuffle(files)
    for f in records:
        text = _read(f)
        if text:
            yield group, "table.record", text
    budget = {"code": 0, "doc": 0}
    for f in files:
        kind = "po" if f.suffix == ".po" else ("doc" if f.suffix in DOC_EXT else "code")
        if kind != "po" and budget[kind] >= MAX_FILES * (5 if split_of(group) == "ngram" else 1):
            continue
        text = _read(f)
        if not text:
            continue
        if kind == "po":
            yield f"{group}:{_lang_of(f)}", "po", _po_text(text)
            continue
        budget[kind] += 1
        yield group, f"{kind}{f.suffix}", text
        if f.suffix == ".py":
            docs = [d.strip("\n") for d in _DOCSTRING.findall(text) if len(d) > 60]
            if docs:
                yield group, "doc.docstring", "\n\n".join(_dedent(d) for d in docs)


_DOCSTRING = re.compile(r'"""(.*?)"""', re.S)


def _dedent(s: str) -> str:
    import textwrap

    first, _, rest = s.partition("\n")
    return (first.strip() + "\n" + textwrap.dedent(rest)).strip()


def pyhelp_texts(rng: random.Random) -> Iterator[tuple[str, str, str]]:
    """Help as a terminal shows it: ``pydoc`` pages of standard-library modules and the
    ``--help`` of the environment's command-line programs (options laid out in columns)."""
    import pydoc

    skip = {"antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo", "pydoc_data"}
    names = sorted(n for n in sys.stdlib_module_names if not n.startswith("_") and n not in skip)
    rng.shuffle(names)
    for name in names[:150]:
        try:
            mod = __import__(name)
            text = pydoc.render_doc(mod, renderer=pydoc.plaintext)  # type: ignore[attr-defined]
        except Exception:  # noqa: BLE001 (any module may fail to import or render)
            continue
        yield f"pyhelp:pydoc:{name}", "doc.pydoc", text
    bindir = Path(sys.executable).parent
    for exe in sorted(bindir.iterdir()):
        if exe.name.startswith(("python", "activate", "pip3", "harness")) or not exe.is_file():
            continue
        try:
            r = subprocess.run(
                [str(exe), "--help"], capture_output=True, timeout=20, stdin=subprocess.DEVNULL
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        text = r.stdout.decode("utf-8", "replace")
        if len(text) > 200:
            yield f"pyhelp:cli:{exe.name}", "doc.help", text


def locale_texts(rng: random.Random) -> Iterator[tuple[str, str, str]]:
    """Babel's locale data (CLDR) when installed: names of languages, territories, scripts,
    currencies, months and days in hundreds of locales, one name per line (the shape of a
    translation catalog of names), and numbers, amounts, dates, durations and lists of
    measures as each locale writes them (``12公里``, ``1999年12月14日星期二``, ``41,4
    киловатт-часа и 1 час``: digits among the letters of any script). One group per
    language."""
    try:
        from babel import Locale, localedata
    except ImportError:
        return
    ids = sorted(i for i in localedata.locale_identifiers() if "_" not in i)
    rng.shuffle(ids)
    for lid in ids[:200]:
        try:
            loc = Locale.parse(lid)
            tables = [loc.languages, loc.territories, loc.scripts, loc.currencies]
            names = [list(t.values()) for t in tables if t]
            names.append([str(v) for v in dict(loc.months["format"]["wide"]).values()])
            names.append([str(v) for v in dict(loc.days["format"]["wide"]).values()])
        except (ValueError, KeyError, TypeError):
            continue
        for ns in names:
            if ns:
                yield f"pylocale:{lid}", "doc.locale", "\n".join(str(n) for n in ns)
        shown = [t for t in (_locale_line(rng, lid) for _ in range(rng.randint(20, 60))) if t]
        if shown:  # numbers, dates and units as the locale writes them (digits in any script)
            yield f"pylocale:{lid}", "doc.numbers", "\n".join(shown)


_UNITS = [
    "length-kilometer",
    "length-meter",
    "length-centimeter",
    "length-mile",
    "mass-kilogram",
    "mass-gram",
    "duration-year",
    "duration-month",
    "duration-day",
    "duration-hour",
    "duration-minute",
    "duration-second",
    "temperature-celsius",
    "volume-liter",
    "area-square-meter",
    "speed-kilometer-per-hour",
    "digital-megabyte",
    "digital-gigabyte",
    "power-watt",
    "energy-kilowatt-hour",
]


def _locale_line(rng: random.Random, lid: str) -> str | None:
    """One number, amount, date, duration or list of measures, formatted by Babel for the
    locale ``lid`` (None where the locale's data lacks it)."""
    import datetime

    from babel import dates, lists, numbers, units

    def value() -> float:
        return rng.choice(
            [rng.randint(0, 12), rng.randint(10, 999), rng.randint(1000, 10**7),
             round(rng.uniform(0, 100), rng.randint(1, 2))]
        )  # fmt: skip

    k = rng.randrange(8)
    when = datetime.datetime(
        rng.randint(1950, 2030), rng.randint(1, 12), rng.randint(1, 28), rng.randint(0, 23),
        rng.randint(0, 59),
    )  # fmt: skip
    length = rng.choice(["long", "short", "narrow"])
    try:
        if k == 0:
            return str(units.format_unit(value(), rng.choice(_UNITS), length=length, locale=lid))
        if k == 1:
            return str(numbers.format_decimal(value(), locale=lid))
        if k == 2:
            return str(numbers.format_percent(rng.random(), locale=lid))
        if k == 3:
            cur = rng.choice(["USD", "EUR", "CNY", "JPY", "INR", "RUB", "GBP"])
            return str(numbers.format_currency(value(), cur, locale=lid))
        if k == 4:
            fmt = rng.choice(["full", "long", "medium", "short"])
            return str(dates.format_date(when, format=fmt, locale=lid))
        if k == 5:
            fmt = rng.choice(["full", "long", "medium"])
            return str(dates.format_datetime(when, format=fmt, locale=lid))
        if k == 6:
            span = datetime.timedelta(seconds=rng.randint(1, 10**7))
            return str(
                dates.format_timedelta(span, locale=lid, format=rng.choice(["long", "short"]))
            )
        parts = [
            str(units.format_unit(value(), rng.choice(_UNITS), locale=lid))
            for _ in range(rng.randint(2, 4))
        ]
        return str(lists.format_list(parts, locale=lid))
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def osdoc_texts(rng: random.Random) -> Iterator[tuple[str, str, str]]:
    doc = Path("/usr/share/doc")
    for pkg in sorted(doc.iterdir()) if doc.is_dir() else []:
        files = [p for p in pkg.rglob("*") if p.is_file() and p.name != "copyright"]
        rng.shuffle(files)
        for f in files[:8]:
            text = _read(f)
            if text:
                yield f"osdoc:doc:{pkg.name}", "osdoc", text
    man = sorted(Path("/usr/share/man").glob("man[1-8]/*"))
    rng.shuffle(man)
    for f in man[:400]:
        try:
            r = subprocess.run(
                ["man", "-l", str(f)],
                capture_output=True,
                timeout=20,
                env={"MANWIDTH": "80", "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        text = r.stdout.decode("utf-8", "replace")
        text = re.sub(r".\x08", "", text)
        if text.strip():
            yield f"osdoc:man:{f.name.split('.')[0]}", "man", text
    mos = sorted(Path("/usr/share/locale").rglob("*.mo"))
    rng.shuffle(mos)
    for f in mos[:1500]:
        try:
            with f.open("rb") as fh:
                cat = gettext.GNUTranslations(fh)
        except (OSError, UnicodeDecodeError, struct.error, Exception):  # noqa: BLE001
            continue
        vals = [v for k, v in cat._catalog.items() if k and isinstance(v, str)]  # type: ignore[attr-defined]
        lang = f.parts[f.parts.index("locale") + 1]
        if vals:
            yield f"osdoc:locale:{lang}", "mo", "\n".join(vals)
