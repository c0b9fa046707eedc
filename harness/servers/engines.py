"""Engine builds, each in a virtual environment of its own.

``--engine 0.1.11`` (or ``xllamacpp==0.1.11``) names a build of the engine's wheel on the
package registry: the first use installs it into ``<cache>/engines/xllamacpp-0.1.11`` (a
virtual environment made with the harness's own Python, the wheel installed by the harness's
pip), later uses find it there. ``--engine PATH`` names a virtual environment that has the
engine installed already (a local build, a patched wheel). Either way the launcher puts that
environment's ``site-packages`` first on ``sys.path`` before it imports the engine, so the
harness's own code runs beside any build of the engine (xllamacpp wheels have no
dependencies of their own).

The cache folder is ``$HARNESS_CACHE_DIR``, else ``$XDG_CACHE_HOME/harness``, else
``~/.cache/harness``. Installs are made under a lock (two variants launched at once install a
build once) and count only once complete: a half-made environment is made again.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import shutil
import subprocess
import sys
import venv
from collections.abc import Iterator
from pathlib import Path

from harness.errors import InfrastructureError, UsageError

log = logging.getLogger("harness.engines")

ENGINE_PACKAGE = "xllamacpp"
#: a release of the registry (PEP 440's usual shapes: 0.1.11, 2026.10.11549, 0.2.0rc1)
_VERSION = re.compile(r"[0-9]+(?:\.[0-9]+)*(?:(?:a|b|rc|\.post|\.dev)[0-9]+)*")
_COMPLETE = ".harness-engine"  # written last: the environment is whole


def cache_root() -> Path:
    if os.environ.get("HARNESS_CACHE_DIR"):
        return Path(os.environ["HARNESS_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path("~/.cache").expanduser())
    return Path(base) / "harness"


def parse_version(spec: str) -> str | None:
    """``"0.1.11"`` or ``"xllamacpp==0.1.11"`` -> ``"0.1.11"``; anything else -> None."""
    text = spec.strip()
    if text.startswith(f"{ENGINE_PACKAGE}=="):
        text = text[len(ENGINE_PACKAGE) + 2 :]
    return text if _VERSION.fullmatch(text) else None


def site_packages(env: Path) -> Path:
    """The ``site-packages`` of the virtual environment ``env`` for this Python version."""
    here = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    found = env / "lib" / here / "site-packages"
    if found.is_dir():
        return found
    others = sorted(p.parent.name for p in env.glob("lib/python3*/site-packages"))
    if others:
        raise UsageError(
            f"--engine {env}: that environment is for {', '.join(others)}, the harness runs "
            f"{here}; make it with the harness's Python ({sys.executable} -m venv)"
        )
    raise UsageError(
        f"--engine {env}: not a virtual environment (no lib/{here}/site-packages); give a "
        f"version of {ENGINE_PACKAGE} (e.g. 0.1.12) or the path of a virtual environment "
        f"that has {ENGINE_PACKAGE} installed"
    )


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def installed_env(version: str, root: Path | None = None) -> Path:
    """The environment of ``xllamacpp==version``, made (venv + pip install) on first use."""
    env = (root or cache_root()) / "engines" / f"{ENGINE_PACKAGE}-{version}"
    if (env / _COMPLETE).is_file():
        return env
    with _locked(env.with_name(env.name + ".lock")):
        if (env / _COMPLETE).is_file():
            return env
        if env.exists():
            shutil.rmtree(env)
        log.info("installing %s==%s into %s (once)", ENGINE_PACKAGE, version, env)
        venv.EnvBuilder(with_pip=False, clear=True).create(env)
        python = env / "bin" / "python"
        cmd = [
            sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
            "--disable-pip-version-check", "--no-deps", f"{ENGINE_PACKAGE}=={version}",
        ]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            shutil.rmtree(env, ignore_errors=True)
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise InfrastructureError(
                f"could not install {ENGINE_PACKAGE}=={version} into {env}: "
                + (" | ".join(tail) or f"pip exited with {done.returncode}")
                + f" (is {version} a version on the package registry? pip index versions "
                f"{ENGINE_PACKAGE})"
            )
        (env / _COMPLETE).write_text(f"{ENGINE_PACKAGE}=={version}\n")
    return env


def resolve(spec: str, root: Path | None = None) -> Path:
    """``--engine`` -> the ``site-packages`` folder to import the engine from."""
    version = parse_version(spec)
    path = Path(spec).expanduser()
    if version is not None and not path.exists():
        return site_packages(installed_env(version, root))
    if not path.is_dir():
        raise UsageError(
            f"--engine {spec}: neither a version of {ENGINE_PACKAGE} (e.g. 0.1.12 or "
            f"{ENGINE_PACKAGE}==0.1.12) nor a folder"
        )
    found = site_packages(path)
    if not (found / ENGINE_PACKAGE).is_dir():
        raise UsageError(
            f"--engine {spec}: {ENGINE_PACKAGE} is not installed in that environment "
            f"({path}/bin/python -m pip install {ENGINE_PACKAGE}==VERSION)"
        )
    return found


def use(spec: str, root: Path | None = None) -> Path:
    """Put the engine named by ``spec`` first on ``sys.path`` (before it is imported)."""
    if ENGINE_PACKAGE in sys.modules:
        raise UsageError(f"--engine: {ENGINE_PACKAGE} is imported already; cannot switch builds")
    found = resolve(spec, root)
    sys.path.insert(0, str(found))
    return found
