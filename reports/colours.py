"""The report's colours: one palette whose colours a reader can tell apart,
and the colour difference that says so.

``delta_e2000`` is CIEDE2000 (Sharma, Wu and Dalal, "The CIEDE2000
color-difference formula: implementation notes", 2005) between two sRGB hex
colours, through CIE L*a*b* under D65. Every pair of ``PALETTE``'s colours
is at least ``MIN_DELTA_E`` apart by it, and none is within ``MIN_DELTA_E``
of the white page (a test checks both). A delta E of about 2 is the
smallest difference people notice side by side; 20 is a clearly different
colour in a legend and on a thin line.

A report colours each built-in router by its place in the registry's order
(``harness.cli.report`` passes it): a router has the same colour in every
report and all of them are distinguishable at once; a plug-in takes a colour
after them (see ``Palette``). Past ``len(PALETTE)`` names, colours repeat.
"""
from __future__ import annotations

import math

MIN_DELTA_E = 20.0

# Chosen greedily from a 18-step grid of the sRGB cube, kept to colours of
# lightness at most 80 and at least 30 from white (thin lines stay visible on
# the page): each colour the one furthest from every colour already in,
# starting from matplotlib's first blue, until none is 20.5 away. The 23 it
# gives are pairwise at least 20.6 apart; four lighter ones were added after
# them: one for each built-in router (25), and two more for plug-ins.
PALETTE = ("#1f77b4", "#b4d200", "#ff5a00", "#1e4b00", "#3c000f", "#ff00e1", "#00c3b4", "#5a00b4", "#784b00",
           "#968787", "#d2004b", "#ffb40f", "#0f1e1e", "#009600", "#a596f0", "#007869", "#96873c", "#5a4b4b",
           "#ff87a5", "#00003c", "#870f00", "#875a96", "#1eb4e1",
           # the three learned routers: the same greedy from these 23, on a 35-step grid, any lightness at
           # least 20.3 from white (no darker colour is 20 from all 23)
           "#00ff8e", "#f8c3ac", "#f8d2ff", "#b4c3a5")


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
    """A fixed colour per name. While the names in ``order`` (the caller's:
    the router registry's, every built-in router) and the others shown fit
    in ``PALETTE``, a name of ``order`` takes the colour of its place there,
    so a router has the same colour in every report, and the others (plug-ins)
    take the colours after; otherwise the names shown take the colours in
    turn, ``order``'s first."""

    def __init__(self, names, order=()):
        names = set(names)
        order = list(dict.fromkeys(order))
        extra = sorted(names - set(order))
        if len(order) + len(extra) <= len(PALETTE):
            self.order = order + extra
        else:
            known = [n for n in order if n in names]
            self.order = known + extra

    def __call__(self, name: str) -> str:
        if name not in self.order:
            self.order.append(name)
        return PALETTE[self.order.index(name) % len(PALETTE)]
