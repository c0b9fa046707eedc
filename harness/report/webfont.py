"""The page's own font for the one character of tool-call markup no common font has.

DeepSeek's DSML writes ``<｜DSML｜...>`` with U+FF5C FULLWIDTH VERTICAL LINE, which only CJK
fonts draw; a browser on a machine without one shows an empty box there, and intact markup
looks corrupted. report.html embeds this font (a data URI, under a kilobyte), limited to
U+FF5C and named last before the generic family in every font stack: a CJK font the machine
has still draws the bar, and the page draws it where none does. Its one glyph is a rectangle
made by ``tools/bar_font.py`` (no other font's outlines); ``python -m tools.bar_font
--check`` says whether this copy is that tool's output.
"""

from __future__ import annotations

#: the family name the font stacks use
BAR_FAMILY = "harness-bar"
#: the TrueType font, base64 (python -m tools.bar_font)
BAR_FONT_TTF = (
    "AAEAAAAKAIAAAwAgT1MvMkRMRYAAAAEoAAAAYGNtYXAADP+vAAABkAAAADRnbHlmhpoOrgAAAcwAAAAaaGVhZC39"
    "/9gAAACsAAAANmhoZWEHWgU8AAAA5AAAACRobXR4BbIAAAAAAYgAAAAGbG9jYQANAAAAAAHEAAAABm1heHAABAAG"
    "AAABCAAAACBuYW1l0Z8CyQAAAegAAABscG9zdKSyTbsAAAJUAAAALgABAAAAAQAArNlJw18PPPUAAwPoAAAAAOV/"
    "XgAAAAAA5X9eAAHK/4gCHgNwAAAAAwACAAAAAAAAAAEAAANw/4gAAAPoAcoBygIeAAEAAAAAAAAAAAAAAAAAAAAB"
    "AAEAAAACAAQAAQAAAAAAAgAAAAAAAAAAAAAAAAAAAAAAAwPoAZAABQAEAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
    "AAAAAAAAAAAAAAAAAAAAAAAAABAAAAAAPz8/PwAA/1z/XANw/4gAAANwAHgAAAAAAAAAAAAAAAAAAAAgAAAD6AAA"
    "AcoAAAAAAAIAAAADAAAAFAADAAEAAAAUAAQAIAAAAAQABAABAAD/XP//AAD/XP//AKUAAQAAAAAAAAAAAA0AAAAB"
    "Acr/iAIeA3AAAwAABREzEQHKVHgD6PwYAAAAAAAEADYAAQAAAAAAAQALAAAAAQAAAAAAAgAHAAsAAwABBAkAAQAW"
    "ABIAAwABBAkAAgAOAChoYXJuZXNzLWJhclJlZ3VsYXIAaABhAHIAbgBlAHMAcwAtAGIAYQByAFIAZQBnAHUAbABh"
    "AHIAAgAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAACAAABAgd1bmlGRjVDAAA="
)

FONT_FACE = (
    f'@font-face{{font-family:"{BAR_FAMILY}";unicode-range:U+FF5C;font-display:block;'
    f'src:url(data:font/ttf;base64,{BAR_FONT_TTF}) format("truetype")}}'
)
