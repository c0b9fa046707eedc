"""``python -m harness.sim``: the same as ``harness sim``."""

from __future__ import annotations

import logging
import sys

from harness.errors import HarnessError
from harness.sim.main import main

if __name__ == "__main__":
    try:
        sys.exit(main())
    except HarnessError as exc:
        logging.getLogger("harness.sim").error("%s", exc)
        sys.exit(exc.exit_code)
