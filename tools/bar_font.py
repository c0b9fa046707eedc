"""The report's own font for DSML's full-width bar, made from scratch (no font's outlines).

    python -m tools.bar_font          # print the base64 that harness/report/webfont.py holds
    python -m tools.bar_font --check  # exit 1 when the module's copy is not this output

DeepSeek's markup writes ``<｜DSML｜...>`` with U+FF5C FULLWIDTH VERTICAL LINE, which only CJK
fonts have; on a machine without one a browser draws an empty box, and intact markup looks
corrupted. The font has that one glyph: a vertical bar centred in a full-width (1 em) advance,
drawn here as a rectangle, so the page needs no font file of anyone else. The bytes are the
same on every run (fixed timestamps), so the module's copy can be checked against them.
"""

from __future__ import annotations

import base64
import sys
from io import BytesIO

from fontTools.fontBuilder import FontBuilder
from fontTools.pens.ttGlyphPen import TTGlyphPen

from harness.report.webfont import BAR_FONT_TTF

FAMILY = "harness-bar"
UPM = 1000
ASCENT, DESCENT = 880, -120
#: the glyph: a bar of this width, centred, from the descender to the ascender
STROKE = 84
#: 2026-01-01 in the font's clock (seconds since 1904-01-01): the same bytes on every build
STAMP = 3_850_329_600


def _bar() -> object:
    pen = TTGlyphPen(None)
    left = (UPM - STROKE) // 2
    pen.moveTo((left, DESCENT))
    pen.lineTo((left, ASCENT))
    pen.lineTo((left + STROKE, ASCENT))
    pen.lineTo((left + STROKE, DESCENT))
    pen.closePath()
    return pen.glyph()


def _empty() -> object:
    return TTGlyphPen(None).glyph()


def build() -> bytes:
    """The TrueType font: .notdef (empty) and U+FF5C, 1 em wide."""
    fb = FontBuilder(UPM, isTTF=True)
    fb.setupGlyphOrder([".notdef", "uniFF5C"])
    fb.setupCharacterMap({0xFF5C: "uniFF5C"})
    fb.setupGlyf({".notdef": _empty(), "uniFF5C": _bar()})
    fb.setupHorizontalMetrics({".notdef": (UPM, 0), "uniFF5C": (UPM, (UPM - STROKE) // 2)})
    fb.setupHorizontalHeader(ascent=ASCENT, descent=DESCENT)
    fb.setupNameTable({"familyName": FAMILY, "styleName": "Regular"})
    fb.setupOS2(sTypoAscender=ASCENT, sTypoDescender=DESCENT, usWinAscent=ASCENT,
                usWinDescent=-DESCENT)  # fmt: skip
    fb.setupPost()
    fb.font["head"].created = fb.font["head"].modified = STAMP
    out = BytesIO()
    fb.font.save(out)
    return out.getvalue()


def encoded() -> str:
    return base64.b64encode(build()).decode("ascii")


def main(argv: list[str]) -> int:
    text = encoded()
    if "--check" in argv:
        if text != BAR_FONT_TTF:
            print("harness/report/webfont.py: BAR_FONT_TTF differs; paste the output of "
                  "python -m tools.bar_font", file=sys.stderr)  # fmt: skip
            return 1
        return 0
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
