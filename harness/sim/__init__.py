"""The embedded endpoint: an OpenAI-compatible server that behaves like DeepSeek-V4 on SGLang.

``create_app(SimConfig(...))`` builds the ASGI app; ``harness sim`` (main.py) serves it.
"""

from __future__ import annotations
