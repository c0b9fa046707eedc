"""tools/bar_font.py: the report's font for DSML's bar is the tool's output, one glyph wide."""

from __future__ import annotations

import base64
from io import BytesIO

from fontTools.ttLib import TTFont

from harness.report.html import CSS
from harness.report.webfont import BAR_FAMILY, BAR_FONT_TTF, FONT_FACE
from tools import bar_font


def test_the_embedded_font_is_the_tools_output_and_covers_the_bar_alone() -> None:
    assert bar_font.encoded() == BAR_FONT_TTF  # the same bytes on every build
    assert bar_font.main(["--check"]) == 0
    font = TTFont(BytesIO(base64.b64decode(BAR_FONT_TTF)))
    assert font.getBestCmap() == {0xFF5C: "uniFF5C"}
    assert font["hmtx"]["uniFF5C"][0] == font["head"].unitsPerEm  # full width
    assert "unicode-range:U+FF5C" in FONT_FACE
    # named last before the generic family in both stacks
    assert CSS.count(f'"{BAR_FAMILY}",sans-serif') == 1
    assert CSS.count(f'"{BAR_FAMILY}",\n monospace') == 1
