"""The project's own tooling, run from the repository's root (``python -m tools.…``): typed
and linted like the package, never shipped with it nor imported by it."""
