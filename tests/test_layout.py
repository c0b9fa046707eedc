"""Limits on the code's shape that keep it readable, read from the source with ``ast``.

- No function takes more than ``MAX_PARAMS`` parameters (``self`` and ``cls`` aside, ``*args``
  and ``**kwargs`` counted): a longer list is a value object waiting to be named.
- At most ``MAX_LOCAL_IMPORTS`` imports of harness modules inside functions in all of
  ``harness/``, each with a comment on its line giving its reason (what it keeps from
  ``harness --help`` or from a run's start).
- No module below ``cli/`` imports argparse: the command layer turns its flags into the
  run's options; nothing under it reads a namespace.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "harness"
MAX_PARAMS = 8
MAX_LOCAL_IMPORTS = 8
#: Functions still over the limit (none left): each to become narrower; the list stays exact
#: (a function fixed leaves it).
WIDE_YET: set[str] = set()
#: Where argparse belongs: the commands, and the ground floor's argparse value types.
ARGPARSE_HOMES = ("harness/cli/", "harness/argtypes.py")
#: Modules outside the run path that are command lines of their own (``python -m``).
OWN_COMMANDS = ("harness/sim/", "harness/servers/", "harness/llamacpp/")


def _sources() -> list[tuple[str, ast.Module, list[str]]]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        rel = path.relative_to(ROOT).as_posix()
        out.append((rel, ast.parse(text, filename=rel), text.splitlines()))
    return out


SOURCES = _sources()


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    a = fn.args
    names = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    names += [x.arg for x in (a.vararg, a.kwarg) if x is not None]
    return names[1:] if names[:1] in (["self"], ["cls"]) else names


def _functions(tree: ast.Module) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def _local_harness_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    found: dict[int, ast.Import | ast.ImportFrom] = {}
    for fn in _functions(tree):
        for node in ast.walk(fn):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""] if not node.level else ["harness"]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            if any(n == "harness" or n.startswith("harness.") for n in names):
                found[id(node)] = node
    return list(found.values())


def test_no_function_takes_more_than_eight_parameters() -> None:
    wide = {
        f"{rel} {fn.name}"
        for rel, tree, _ in SOURCES
        for fn in _functions(tree)
        if len(_params(fn)) > MAX_PARAMS
    }
    assert not wide - WIDE_YET, "more than 8 parameters:\n" + "\n".join(sorted(wide - WIDE_YET))
    assert wide >= WIDE_YET  # the list stays exact


def test_few_function_local_imports_each_with_its_reason() -> None:
    local = [
        (rel, node, lines[node.lineno - 1])
        for rel, tree, lines in SOURCES
        for node in _local_harness_imports(tree)
    ]
    assert len(local) <= MAX_LOCAL_IMPORTS, "\n".join(f"{r}:{n.lineno}" for r, n, _ in local)
    silent = [f"{rel}:{node.lineno}" for rel, node, line in local if "#" not in line]
    assert not silent, "a function-local import without its reason: " + ", ".join(silent)


def test_no_argparse_below_the_command_layer() -> None:
    wrong = []
    for rel, tree, _ in SOURCES:
        if rel.startswith(ARGPARSE_HOMES + OWN_COMMANDS):
            continue
        for node in ast.walk(tree):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            if "argparse" in names:
                wrong.append(f"{rel}:{node.lineno}")
    assert not wrong, "argparse below cli/: " + ", ".join(wrong)


def test_the_checks_see_what_they_count() -> None:
    """The readers on a made-up module: a wide method, a local import with and without its
    reason, argparse."""
    tree = ast.parse(
        "import argparse\n"
        "class A:\n"
        "    def f(self, a, b, c, d, e, f, g, h, *rest, **kw):\n"
        "        from harness import errors  # lazy: the reason\n"
        "        from . import labels\n"
        "        import json\n"
    )
    [fn] = _functions(tree)
    assert len(_params(fn)) == 10
    assert len(_local_harness_imports(tree)) == 2
