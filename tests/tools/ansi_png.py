"""Render a terminal capture with ANSI colours (`tmux capture-pane -e -p`) to a PNG.

Used to make the README screenshot from the running program:
    tmux capture-pane -e -p -t SESSION > screen.ansi
    python3 tests/tools/ansi_png.py screen.ansi assets/screenshot.png
`--light` draws it as a light terminal would (black on white, the same 16 colours), to check
the light theme (`theme = "light"` in ui.toml) for contrast.
"""
import re
import sys

from PIL import Image, ImageDraw, ImageFont

FONT = "/usr/share/fonts/truetype/dejavu/DejaVuSansMono.ttf"
BOLD = "/usr/share/fonts/truetype/dejavu/DejaVuSansMono-Bold.ttf"
BG = (18, 18, 24)
FG = (220, 220, 220)
BASE = [
    (0, 0, 0), (205, 49, 49), (13, 188, 121), (229, 229, 16),
    (36, 114, 200), (188, 63, 188), (17, 168, 205), (229, 229, 229),
    (102, 102, 102), (241, 76, 76), (35, 209, 139), (245, 245, 67),
    (59, 142, 234), (214, 112, 214), (41, 184, 219), (255, 255, 255),
]


def xterm256(n):
    if n < 16:
        return BASE[n]
    if n < 232:
        n -= 16
        steps = [0, 95, 135, 175, 215, 255]
        return (steps[n // 36], steps[(n // 6) % 6], steps[n % 6])
    v = 8 + (n - 232) * 10
    return (v, v, v)


def parse(text):
    """Yields rows of (char, fg, bg, bold)."""
    rows = []
    fg, bg, bold, rev = FG, BG, False, False
    for line in text.split("\n"):
        row = []
        i = 0
        while i < len(line):
            m = re.match(r"\x1b\[([0-9;]*)m", line[i:])
            if m:
                codes = [int(c) if c else 0 for c in m.group(1).split(";")]
                k = 0
                while k < len(codes):
                    c = codes[k]
                    if c == 0:
                        fg, bg, bold, rev = FG, BG, False, False
                    elif c == 1:
                        bold = True
                    elif c == 7:
                        rev = True
                    elif c == 22:
                        bold = False
                    elif c == 27:
                        rev = False
                    elif 30 <= c <= 37:
                        fg = BASE[c - 30]
                    elif 90 <= c <= 97:
                        fg = BASE[c - 90 + 8]
                    elif c == 39:
                        fg = FG
                    elif 40 <= c <= 47:
                        bg = BASE[c - 40]
                    elif 100 <= c <= 107:
                        bg = BASE[c - 100 + 8]
                    elif c == 49:
                        bg = BG
                    elif c in (38, 48) and k + 2 < len(codes) and codes[k + 1] == 5:
                        col = xterm256(codes[k + 2])
                        if c == 38:
                            fg = col
                        else:
                            bg = col
                        k += 2
                    elif c in (38, 48) and k + 4 < len(codes) and codes[k + 1] == 2:
                        col = tuple(codes[k + 2:k + 5])
                        if c == 38:
                            fg = col
                        else:
                            bg = col
                        k += 4
                    k += 1
                i += m.end()
                continue
            ch = line[i]
            f, b = (bg, fg) if rev else (fg, bg)
            row.append((ch, f, b, bold))
            i += 1
        rows.append(row)
    while rows and not rows[-1]:
        rows.pop()
    return rows


BLOCKS = "▁▂▃▄▅▆▇"
# Braille dot bits: (bit, column, row).
DOTS = [(0, 0, 0), (1, 0, 1), (2, 0, 2), (3, 1, 0), (4, 1, 1), (5, 1, 2), (6, 0, 3), (7, 1, 3)]


def braille(d, bits, px, py, cw, ch, fill):
    for bit, col, row in DOTS:
        if bits & (1 << bit):
            x = px + (col * 2 + 1) * cw // 4
            y = py + (row * 2 + 1) * ch // 8
            d.rectangle([x - 1, y - 1, x, y], fill=fill)


def render(rows, out):
    size = 15
    font = ImageFont.truetype(FONT, size)
    bold = ImageFont.truetype(BOLD, size)
    cw = int(font.getlength("M"))
    ch = size + 4
    width = max(len(r) for r in rows)
    img = Image.new("RGB", (width * cw + 16, len(rows) * ch + 16), BG)
    d = ImageDraw.Draw(img)
    for y, row in enumerate(rows):
        for x, (c, f, b, bd) in enumerate(row):
            px, py = 8 + x * cw, 8 + y * ch
            if b != BG:
                d.rectangle([px, py, px + cw - 1, py + ch - 1], fill=b)
            if c == "█":
                d.rectangle([px, py, px + cw - 1, py + ch - 1], fill=f)
            elif 0x2800 <= ord(c) <= 0x28FF:
                braille(d, ord(c) - 0x2800, px, py, cw, ch, f)
            elif c in BLOCKS:
                frac = BLOCKS.index(c) + 1
                top = py + ch - frac * ch // 8
                d.rectangle([px, top, px + cw - 1, py + ch - 1], fill=f)
            elif c != " ":
                d.text((px, py + 1), c, font=bold if bd else font, fill=f)
    img.save(out)


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--light"]
    if "--light" in sys.argv:
        BG, FG = (255, 255, 255), (0, 0, 0)
    render(parse(open(args[0], encoding="utf-8").read()), args[1])
