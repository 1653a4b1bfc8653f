"""The report's colours: one palette whose colours a reader can tell apart,
and the colour difference that says so.

``delta_e2000`` is CIEDE2000 (Sharma, Wu and Dalal, "The CIEDE2000
color-difference formula: implementation notes", 2005) between two sRGB hex
colours, through CIE L*a*b* under D65. Every pair of ``PALETTE``'s colours
is at least ``MIN_DELTA_E`` apart by it, and none is within ``MIN_DELTA_E``
of the white page (a test checks both). A delta E of about 2 is the
smallest difference people notice side by side; 20 is a clearly different
colour in a legend and on a thin line.

A report colours the routers it shows, in the order its caller gives
(registry order: ``harness.cli.report`` passes it), with the first colours
of ``PALETTE``: so any report of up to ``len(PALETTE)`` routers has them
all distinguishable, and the same routers get the same colours in every
report. Past ``len(PALETTE)`` names, colours repeat.
"""
from __future__ import annotations

import math

MIN_DELTA_E = 20.0

# Tableau 10 without its brown and pink (16 and 17 from red and purple),
# then colours added one at a time, each the one of a 15-step grid of the
# sRGB cube (lightness 25-75, at least 25 from white) furthest from every
# colour already in: the 20 it gives are pairwise at least 20.1 apart.
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#7f7f7f", "#bcbd22", "#17becf",
           "#004b2d", "#5a3c00", "#78004b", "#ff96a5", "#0000d2", "#a5b4ff", "#3c3c4b", "#96780f", "#f00087",
           "#008778", "#ff87ff", "#96b496")


def _linear(c: float) -> float:
    return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4


def hex_to_lab(hex_color: str) -> tuple[float, float, float]:
    """CIE L*a*b* (D65) of an sRGB ``#rrggbb`` colour."""
    h = hex_color.lstrip("#")
    if len(h) != 6:
        raise ValueError(f"not an sRGB hex colour: {hex_color!r}")
    r, g, b = (_linear(int(h[i:i + 2], 16) / 255.0) for i in (0, 2, 4))
    x = (0.4124564 * r + 0.3575761 * g + 0.1804375 * b) / 0.95047
    y = 0.2126729 * r + 0.7151522 * g + 0.0721750 * b
    z = (0.0193339 * r + 0.1191920 * g + 0.9503041 * b) / 1.08883

    def f(t: float) -> float:
        return t ** (1 / 3) if t > (6 / 29) ** 3 else t / (3 * (6 / 29) ** 2) + 4 / 29

    fx, fy, fz = f(x), f(y), f(z)
    return 116 * fy - 16, 500 * (fx - fy), 200 * (fy - fz)


def ciede2000(lab1: tuple[float, float, float], lab2: tuple[float, float, float]) -> float:
    """CIEDE2000 colour difference of two L*a*b* colours (kL = kC = kH = 1)."""
    l1, a1, b1 = lab1
    l2, a2, b2 = lab2
    c_bar = (math.hypot(a1, b1) + math.hypot(a2, b2)) / 2
    g = 0.5 * (1 - math.sqrt(c_bar ** 7 / (c_bar ** 7 + 25 ** 7)))
    a1p, a2p = (1 + g) * a1, (1 + g) * a2
    c1p, c2p = math.hypot(a1p, b1), math.hypot(a2p, b2)
    h1p = math.degrees(math.atan2(b1, a1p)) % 360 if c1p else 0.0
    h2p = math.degrees(math.atan2(b2, a2p)) % 360 if c2p else 0.0
    dlp, dcp = l2 - l1, c2p - c1p
    if c1p * c2p == 0:
        dhp = 0.0
    elif abs(h2p - h1p) <= 180:
        dhp = h2p - h1p
    elif h2p - h1p > 180:
        dhp = h2p - h1p - 360
    else:
        dhp = h2p - h1p + 360
    dHp = 2 * math.sqrt(c1p * c2p) * math.sin(math.radians(dhp / 2))
    lp_bar, cp_bar = (l1 + l2) / 2, (c1p + c2p) / 2
    if c1p * c2p == 0:
        hp_bar = h1p + h2p
    elif abs(h1p - h2p) <= 180:
        hp_bar = (h1p + h2p) / 2
    elif h1p + h2p < 360:
        hp_bar = (h1p + h2p + 360) / 2
    else:
        hp_bar = (h1p + h2p - 360) / 2
    t = (1 - 0.17 * math.cos(math.radians(hp_bar - 30)) + 0.24 * math.cos(math.radians(2 * hp_bar))
         + 0.32 * math.cos(math.radians(3 * hp_bar + 6)) - 0.20 * math.cos(math.radians(4 * hp_bar - 63)))
    d_theta = 30 * math.exp(-(((hp_bar - 275) / 25) ** 2))
    rc = 2 * math.sqrt(cp_bar ** 7 / (cp_bar ** 7 + 25 ** 7))
    sl = 1 + 0.015 * (lp_bar - 50) ** 2 / math.sqrt(20 + (lp_bar - 50) ** 2)
    sc = 1 + 0.045 * cp_bar
    sh = 1 + 0.015 * cp_bar * t
    rt = -math.sin(math.radians(2 * d_theta)) * rc
    return math.sqrt((dlp / sl) ** 2 + (dcp / sc) ** 2 + (dHp / sh) ** 2 + rt * (dcp / sc) * (dHp / sh))


def delta_e2000(hex1: str, hex2: str) -> float:
    """CIEDE2000 between two sRGB hex colours."""
    return ciede2000(hex_to_lab(hex1), hex_to_lab(hex2))


class Palette:
    """A fixed colour per name: the names in ``order`` (the caller's, e.g.
    the router registry's) that the report shows first, then the others in
    name order; each takes the next colour of ``PALETTE``."""

    def __init__(self, names, order=()):
        names = set(names)
        known = [n for n in order if n in names]
        self.order = known + sorted(names - set(known))

    def __call__(self, name: str) -> str:
        if name not in self.order:
            self.order.append(name)
        return PALETTE[self.order.index(name) % len(PALETTE)]
