"""The package's shape: every module imports alone, no import cycle, imports go one way.

The graph is read from the source with ``ast`` (top-level, ``TYPE_CHECKING`` and function-local
imports alike), so a cycle cannot hide behind an import deferred into a function.
"""

from __future__ import annotations

import ast
import graphlib
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "harness"
GROUND = {
    "harness",
    "harness.errors",
    "harness.labels",
    "harness.argtypes",
    "harness.portfile",
    "harness.tomlfile",
}

#: What each package may import besides itself and the ground floor (docs/architecture.md).
ALLOWED: dict[str, set[str]] = {
    "dialects": set(),
    "verdict": {"dialects"},
    "record": set(),
    "workload": {"client", "record", "dialects"},
    "client": {"record", "dialects"},
    "target": {"workload", "client", "record"},
    "drive": {"client", "target", "verdict", "workload", "record", "dialects"},
    "pool": {"drive", "client", "target", "verdict", "workload", "record", "dialects"},
    "analysis": {"record"},
    "report": {"analysis", "record"},
    "run": {
        "pool",
        "drive",
        "client",
        "target",
        "verdict",
        "workload",
        "record",
        "dialects",
        "analysis",
    },
    "sim": {"dialects"},
    "servers": set(),
    "llamacpp": {"servers"},
    "cli": {
        "run",
        "pool",
        "drive",
        "client",
        "target",
        "verdict",
        "workload",
        "record",
        "dialects",
        "analysis",
        "report",
        "sim",
        "servers",
    },
}

#: The only function-local imports of harness modules: the command layer loads a command's
#: modules when that command runs, so that ``harness --help`` imports no pandas, scipy or
#: matplotlib (nor the simulator's web stack); ``sequential`` takes scipy only when a run
#: takes looks; ``run`` takes pandas for the detector's false alarms only in a dry run.
#: (tests/test_layout.py keeps their number at 8 at most, each with its reason.)
LAZY_HEAVY: set[tuple[str, str]] = {
    ("harness.cli.main", "harness.cli.run"),  # the run stack: numpy
    ("harness.cli.main", "harness.cli.inspection"),  # numpy, jsonschema, the run stack
    ("harness.cli.main", "harness.sim.main"),  # starlette, uvicorn
    ("harness.cli.gates", "harness.report.build"),  # pandas, matplotlib
    ("harness.cli.bisect", "harness.run.bisect"),  # pandas (the runs' turns read together)
    ("harness.analysis.sequential", "harness.analysis.stats"),  # scipy
    # pandas: only for --dry-run --detect (the verdict's measured false alarms)
    ("harness.cli.run", "harness.analysis.tiers"),
}


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    local: bool  # inside a function
    line: int


def _modules(root: Path = ROOT, package: str = "harness") -> dict[str, Path]:
    out: dict[str, Path] = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__main__":
            continue
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _imports(modules: dict[str, Path] = MODULES, package: str = "harness") -> list[Import]:
    found: list[Import] = []
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        is_pkg = path.name == "__init__.py"

        def visit(node: ast.AST, local: bool, name: str = name, is_pkg: bool = is_pkg) -> None:
            for child in ast.iter_child_nodes(node):
                inner = local or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
                targets: list[str] = []
                if isinstance(child, ast.Import):
                    targets = [a.name for a in child.names]
                elif isinstance(child, ast.ImportFrom):
                    base = child.module or ""
                    if child.level:
                        anchor = name.split(".") if is_pkg else name.split(".")[:-1]
                        anchor = anchor[: len(anchor) - child.level + 1]
                        base = ".".join([*anchor, *([base] if base else [])])
                    for alias in child.names:
                        sub = f"{base}.{alias.name}"
                        targets.append(sub if sub in modules else base)
                for t in targets:
                    if t == package or t.startswith(package + "."):
                        found.append(Import(name, t, local, child.lineno))
                visit(child, inner)

        visit(tree, False)
    return found


IMPORTS = _imports()


def _package(module: str) -> str:
    if module in GROUND:
        return "ground"
    return module.split(".")[1]


def test_every_module_imports_in_a_fresh_interpreter() -> None:
    """Each module alone, in a fixed order, in one new interpreter: a cycle fails the import."""
    names = sorted(MODULES)
    code = (
        "import importlib, sys\n"
        f"for name in {names!r}:\n"
        "    for m in [m for m in sys.modules if m == 'harness' or m.startswith('harness.')]:\n"
        "        del sys.modules[m]\n"
        "    importlib.import_module(name)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]


def _cycle(modules: dict[str, Path], imports: list[Import]) -> list[str] | None:
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for imp in imports:
        if imp.imported != imp.importer:
            graph[imp.importer].add(imp.imported)
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as exc:
        return list(exc.args[1])
    return None


def test_the_import_graph_has_no_cycle() -> None:
    cycle = _cycle(MODULES, IMPORTS)
    assert cycle is None, f"import cycle: {' -> '.join(cycle or [])}"


def test_packages_import_one_way() -> None:
    """cli -> run -> pool -> drive -> client/target/verdict/workload -> record -> ground."""
    wrong = []
    for imp in IMPORTS:
        src, dst = _package(imp.importer), _package(imp.imported)
        if dst in (src, "ground") or src == "ground" and dst == "ground":
            continue
        if src == "ground" or dst not in ALLOWED[src]:
            wrong.append(f"{imp.importer}:{imp.line} imports {imp.imported}")
    assert not wrong, "\n".join(wrong)


def test_nothing_imports_the_command_layer() -> None:
    wrong = [
        f"{i.importer}:{i.line}"
        for i in IMPORTS
        if _package(i.imported) == "cli" and _package(i.importer) != "cli"
    ]
    assert not wrong


def test_no_function_local_import_of_a_harness_module_but_the_lazy_heavy_ones() -> None:
    local = {(i.importer, i.imported) for i in IMPORTS if i.local}
    assert local - LAZY_HEAVY == set()
    assert LAZY_HEAVY - local == set()  # the list stays exact


def test_the_package_never_imports_the_tooling() -> None:
    """``tools/`` (the detector's corpus, training and evaluation) reads the package; the
    package never reads it: it is not shipped."""
    wrong = []
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                targets = [node.module or ""]
            else:
                continue
            wrong += [f"{name}:{node.lineno}" for t in targets if t.split(".")[0] == "tools"]
    assert not wrong


def test_the_graph_reader_finds_a_cycle_hidden_in_a_function(tmp_path: Path) -> None:
    """A package whose two modules import each other, one of them inside a function (and
    through a relative import): the reader sees both edges, the local one as local."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from .. import a\n    return a\n")
    modules = _modules(tmp_path, "pkg")
    imports = _imports(modules, "pkg")
    assert {(i.importer, i.imported, i.local) for i in imports} == {
        ("pkg.a", "pkg.sub.b", False),
        ("pkg.sub.b", "pkg.a", True),
    }
    assert _cycle(modules, imports) is not None


def test_help_imports_no_heavy_library() -> None:
    code = (
        "import sys\n"
        "from harness.cli.main import build_parser\n"
        "build_parser().format_help()\n"
        "print(sorted(m for m in ('pandas', 'scipy', 'matplotlib') if m in sys.modules))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_a_run_reaches_its_first_request_without_the_report_libraries() -> None:
    """What `harness run` imports and checks before its first request (the run stack, the
    gate expressions) takes no scipy, pandas or matplotlib: 1.5 s of imports that come with
    the report at the end of the run (scipy at the first statistic)."""
    code = (
        "import argparse, sys\n"
        "import harness.cli.run, harness.run.execute, harness.drive.driver\n"
        "from harness.cli.gates import check_gate_args\n"
        "ns = argparse.Namespace(fail_if=['session_corruption_rate > 0.1'], baseline=None)\n"
        "check_gate_args(ns, ['default'])\n"
        "print(sorted(m for m in ('pandas', 'scipy', 'matplotlib') if m in sys.modules))\n"
        "from harness.analysis import stats\n"
        "stats.wilson(1, 10)\n"
        "print('scipy' in sys.modules)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["[]", "True"]
