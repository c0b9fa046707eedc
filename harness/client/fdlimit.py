"""The harness's own open-file limit, checked against the concurrency before a run starts.

Every request in flight holds a socket. A process allowed fewer open files than that fails
its connections with ``EMFILE`` ("Too many open files"): the harness's own environment, which
must not be booked against the server. So before anything starts the soft limit
(``RLIMIT_NOFILE``, ``ulimit -n``) is raised to what the run needs when the hard limit allows
it (worker processes inherit it), and the run does not start when it does not.
"""

from __future__ import annotations

import resource

from harness.errors import InfrastructureError

#: Files besides the connections: the run folder's files, logs, readiness and metrics
#: clients, worker pipes, the interpreter's own.
MARGIN = 128
#: The soft limit asked for at least, when raising it.
RAISE_TO = 4096


def ensure_open_files(connections: int) -> str | None:
    """Make sure this process may open ``connections`` sockets and the rest; return what was
    done (None: nothing needed). Raises InfrastructureError when the hard limit is too low."""
    need = connections + MARGIN
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return None
    if hard != resource.RLIM_INFINITY and hard < need:
        raise InfrastructureError(
            f"{connections} requests in flight need about {need} open files and this process "
            f"may open {soft} (hard limit {hard}): raise it (`ulimit -n {need}`) or lower "
            "--concurrency"
        )
    new = max(need, RAISE_TO)
    if hard != resource.RLIM_INFINITY:
        new = min(new, hard)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
    except (ValueError, OSError) as exc:
        raise InfrastructureError(
            f"{connections} requests in flight need about {need} open files and this process "
            f"may open {soft}; raising the limit failed ({exc}): raise it (`ulimit -n {need}`) "
            "or lower --concurrency"
        ) from None
    return f"open-file limit raised from {soft} to {new} for {connections} requests in flight"
