"""Click parameter types for every number the command line takes.

Why not click's own ``FloatRange``/``IntRange``: ``FloatRange`` lets NaN
through (every comparison with NaN is false, so no bound ever fails), takes
``1e400`` as infinity, and ``type=int`` accepts any size, so ``--rate nan``
used to route every request to the first instance and ``--requests 1e11``
reached the workload generator. These types refuse such values while the
command line is parsed, before any trace is read, with a message naming
the range: ``error: latroute replay: --rate: must be a finite number > 0
(got nan)`` (exit 2, through ``harness.cli``'s one error path).

Values also arrive already typed (defaults, ``sweep --spec`` TOML): an int
or float is checked like its text; a bool is never a number.

Kept free of numpy and pandas: ``latroute --help`` imports this module.
"""
from __future__ import annotations

import math
import os

import click

# The most of anything countable a command accepts (requests, rows, prompts):
# far beyond what fits in memory, well inside int64.
MAX_COUNT = 10**9
# Seeds seed numpy's legacy and PCG generators alike: 32 bits.
MAX_SEED = 2**32 - 1
# Longest numeric text worth reading: past this it cannot be a sane value,
# and Python refuses to parse ints of more than 4300 digits anyway.
_MAX_TEXT = 64


def _shown(value: object) -> str:
    """The offending value as the user typed it, shortened."""
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _bound(lo: float | None, hi: float | None, lo_open: bool, hi_open: bool) -> str:
    """The range in words: ``> 0``, ``>= 1``, ``in (0, 1)``, ``<= 5``."""
    g = "{:g}".format
    if lo is not None and hi is not None:
        return f"in {'(' if lo_open else '['}{g(lo)}, {g(hi)}{')' if hi_open else ']'}"
    if lo is not None:
        return f"{'>' if lo_open else '>='} {g(lo)}"
    if hi is not None:
        return f"{'<' if hi_open else '<='} {g(hi)}"
    return ""


class _Checked(click.ParamType):
    """A parameter type whose ``check`` returns the value or None and whose
    ``describe`` says what it accepts: one refusal message for all."""

    def check(self, value: object):
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError

    def convert(self, value, param, ctx):
        x = self.check(value)
        if x is None:
            self.fail(f"must be {self.describe()} (got {_shown(value)})", param, ctx)
        return x

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.describe()})"

    def range_text(self) -> str:
        """The accepted range, compactly, for the help's metavar."""
        return ""

    def get_metavar(self, param, ctx) -> str:
        """The range in every option's help line (``--burstiness FLOAT
        [0.01,100]``): each limit enforced is stated where it is read."""
        rng = self.range_text()
        return f"{self.name.upper()} {rng}".strip()


class Finite(_Checked):
    """A float within bounds; NaN, -inf and overflow (``1e400``) always
    refused, +inf only where the option documents it (``allow_inf``: e.g.
    ``loadgen --request-rate inf`` = all at once)."""

    name = "float"

    def __init__(self, min: float | None = None, max: float | None = None, min_open: bool = False,
                 max_open: bool = False, allow_inf: bool = False) -> None:
        self.min, self.max, self.min_open, self.max_open, self.allow_inf = min, max, min_open, max_open, allow_inf

    def describe(self) -> str:
        what = "a number" if self.allow_inf else "a finite number"
        rng = _bound(self.min, self.max, self.min_open, self.max_open)
        return f"{what} {rng}".strip() + (" (inf allowed)" if self.allow_inf else "")

    def range_text(self) -> str:
        g = "{:g}".format
        if self.min is not None and self.max is not None:
            return (f"{'(' if self.min_open else '['}{g(self.min)},{g(self.max)}{')' if self.max_open else ']'}"
                    + (" or inf" if self.allow_inf else ""))
        if self.min is not None:
            return f"{'>' if self.min_open else '>='}{g(self.min)}" + (" or inf" if self.allow_inf else "")
        if self.max is not None:
            return f"{'<' if self.max_open else '<='}{g(self.max)}"
        return ""

    def check(self, value: object) -> float | None:
        """``value`` as a float if it is in range, else None."""
        if isinstance(value, bool):
            return None
        if isinstance(value, int | float):
            x = float(value) if not isinstance(value, int) or abs(value) < 2**1023 else math.inf
        elif isinstance(value, str) and len(value.strip()) <= _MAX_TEXT:
            try:
                x = float(value)
            except ValueError:
                return None
        else:
            return None
        if math.isnan(x) or (math.isinf(x) and not (self.allow_inf and x > 0)):
            return None
        if math.isinf(x):  # +inf where the option documents it: above any finite maximum
            return x
        if self.min is not None and (x < self.min or (self.min_open and x == self.min)):
            return None
        if self.max is not None and (x > self.max or (self.max_open and x == self.max)):
            return None
        return x


class IntIn(_Checked):
    """An integer in ``[lo, hi]``, written as one: ``1e11``, ``2.0`` and
    ``1_0`` are refused (``int(float(text))`` would silently round)."""

    name = "integer"

    def __init__(self, lo: int, hi: int) -> None:
        self.lo, self.hi = lo, hi

    def describe(self) -> str:
        return f"an integer in [{self.lo}, {self.hi}]"

    def range_text(self) -> str:
        return f"[{self.lo},{self.hi}]"

    def check(self, value: object) -> int | None:
        if isinstance(value, bool):
            return None
        if isinstance(value, int):
            n = value
        elif isinstance(value, str):
            text = value.strip()
            digits = text[1:] if text[:1] in "+-" else text
            if not digits.isascii() or not digits.isdigit() or len(digits) > _MAX_TEXT:
                return None
            n = int(text)
        else:
            return None
        return n if self.lo <= n <= self.hi else None


class FloatList(click.ParamType):
    """Comma-separated numbers, each checked like ``Finite``; an empty
    list or an empty item (``4,,6``) is refused rather than skipped, since
    a dropped value silently shrinks a sweep."""

    name = "list"

    def __init__(self, item: Finite) -> None:
        self.item = item

    def convert(self, value, param, ctx) -> tuple[float, ...]:
        if isinstance(value, list | tuple):
            parts = list(value)
        elif isinstance(value, int | float) and not isinstance(value, bool):
            parts = [value]
        else:
            parts = str(value).split(",")
        if not parts or parts == [""] or not str(value).strip():
            self.fail(f"needs one or more comma-separated numbers, each {self.item.describe()} (got '')", param, ctx)
        out = []
        for i, part in enumerate(parts, 1):
            x = self.item.check(part.strip() if isinstance(part, str) else part)
            if x is None:
                self.fail(f"item {i} must be {self.item.describe()} (got {_shown(part) or repr(part)})", param, ctx)
            if x in out:  # a repeated value repeats a sweep's cells (or a percentile) under one name
                self.fail(f"item {i} repeats {_shown(part)}: give each value once", param, ctx)
            out.append(x)
        return tuple(out)

    def get_metavar(self, param, ctx) -> str:
        return f"X,Y,... {self.item.range_text()}".strip()

    def __repr__(self) -> str:
        return f"FloatList({self.item!r})"


class KeyFraction(click.ParamType):
    """``NAME=VALUE`` with VALUE a finite number >= 0 (``check
    --tolerance``); returns the text unchanged, so the command's own parser
    decides what NAME may be."""

    name = "NAME=VALUE"

    def __init__(self) -> None:
        self.value = Finite(min=0.0)

    def convert(self, value, param, ctx) -> str:
        name, sep, raw = str(value).partition("=")
        if not sep or not name.strip():
            self.fail(f"expected NAME=VALUE (got {_shown(value)})", param, ctx)
        if self.value.check(raw.strip()) is None:
            self.fail(f"{name.strip()}: must be {self.value.describe()} (got {_shown(raw)})", param, ctx)
        return str(value)


class EngineSetting(click.ParamType):
    """``--engine KEY=VALUE`` (or, with ``grid``, ``--search KEY=V1,V2``)
    checked while parsing by ``harness.requestlevel.engine_options`` itself (imported
    only when the option is given: it loads numpy); returns the text
    unchanged for the command to parse again."""

    name = "KEY=VALUE"

    def __init__(self, grid: bool = False) -> None:
        self.grid = grid

    def convert(self, value, param, ctx) -> str:
        from harness.requestlevel.engine_options import parse_engine_options, parse_search_options
        from traces.errors import BadInput

        try:
            (parse_search_options if self.grid else parse_engine_options)([str(value)])
        except BadInput as e:
            self.fail(e.reason, param, ctx)
        return str(value)


class Window(click.ParamType):
    """``A:B``, 0 <= A < B <= 1: a share of a trace's steps in step order
    (``calibrate --steps-window``, ``estimate --score-window``)."""

    name = "A:B"

    def convert(self, value, param, ctx) -> tuple[float, float]:
        if isinstance(value, tuple):
            return value
        parts = str(value).split(":")
        frac = Finite(min=0.0, max=1.0)
        ab = [frac.check(x) for x in parts] if len(parts) == 2 else [None]
        if None in ab or not ab[0] < ab[1]:
            self.fail(f"must be A:B with 0 <= A < B <= 1, e.g. 0:0.3 (got {_shown(value)})", param, ctx)
        return ab[0], ab[1]


def cores() -> int:
    """CPU cores of this machine: the most worker processes a sweep may start."""
    return os.cpu_count() or 1


# The largest rate, duration, time constant or interval any option takes:
# MAX_TIME_S of traces.datamodel.limits (about 31 years; q/s, s or ms alike), so a
# hostile 1e300 is refused while parsing instead of overflowing a schedule.
MAX_MAGNITUDE = 1e9

# The shared vocabulary, so each option says its range once.
# The smallest: a rate of 1e-300 q/s put the 16,000th arrival at 1e304 s, refused only by the output check
# after the whole run; one per 1,000 s (or a 1 ms duration, time constant or limit) is the least worth asking
MIN_MAGNITUDE = 1e-3
POSITIVE = Finite(min=MIN_MAGNITUDE, max=MAX_MAGNITUDE)  # rates, durations, time constants
NON_NEGATIVE = Finite(min=0.0, max=MAX_MAGNITUDE)  # deltas, lambdas, intervals, think times
# Gamma shape of arrivals: inter-arrival CV^2 = 1/burstiness, from 0.01 (CV^2 100: nearly all requests in a
# few bursts) to 100 (CV^2 0.01: nearly periodic); past these the draws degenerate (1e-300 gives gaps of 0
# and one of the whole duration) and say nothing a neighbouring value does not
BURSTINESS = Finite(min=0.01, max=100.0)
FRACTION_OPEN = Finite(min=0.0, max=1.0, min_open=True, max_open=True)  # (0, 1)
PROBABILITY_BELOW_1 = Finite(min=0.0, max=1.0, max_open=True)  # [0, 1): epsilon
AT_LEAST_1 = Finite(min=1.0, max=MAX_MAGNITUDE)  # burst ratio, half-lives in steps
# A clock's rate against real time (serve and route --speed alike): 1e-300 made a server that never answers
# and 1e300 one whose steps last nothing; a thousandth to a million times real time spans every use
SPEED = Finite(min=1e-3, max=1e6)
COUNT = IntIn(1, MAX_COUNT)  # requests, prompts, rows
SEED = IntIn(0, MAX_SEED)
TOKENS = IntIn(1, 10**7)  # one request's prompt or output length


def server_urls(text: str, option: str) -> tuple[str, ...]:
    """``--backends``/``--base-url``: one or more comma-separated http(s) server roots, each with a port
    in 1-65535 when it names one (``:99999`` once reached the socket layer), trailing ``/`` dropped.
    An empty list or item is refused (``--backends ''`` once failed as an internal IndexError)."""
    from urllib.parse import urlparse

    from traces.errors import BadOption

    parts = str(text).split(",")
    if not str(text).strip():
        raise BadOption(option, "no URL given: give http://HOST:PORT[,...]")
    out = []
    for i, part in enumerate(parts, 1):
        url = part.strip()
        where = f"item {i} " if len(parts) > 1 else ""
        p = urlparse(url)
        if p.scheme not in ("http", "https") or not p.hostname:
            raise BadOption(option, f"{where}is not an http(s) URL: {_shown(url)!r}")
        try:
            port = p.port
        except ValueError:
            port = -1
        if port is not None and not 1 <= port <= 65535:
            raise BadOption(option, f"{where}{_shown(url)!r}: the port must be in 1-65535")
        out.append(url.rstrip("/"))
    return tuple(out)


# X-Request-Id carries the prefix: an HTTP header value is Latin-1 at most, and a request id is logged and
# stored (UTF-8); printable ASCII fits both (``--id-prefix $'\xff'`` once failed as an internal UnicodeEncodeError)
MAX_ID_PREFIX = 64


def check_id_prefix(text: str, option: str = "--id-prefix") -> str:
    """The prefix of every request id sent: printable ASCII without spaces, at most ``MAX_ID_PREFIX`` long."""
    from traces.errors import BadOption

    if len(text) > MAX_ID_PREFIX or not all("!" <= c <= "~" for c in text):
        try:
            shown = repr(os.fsencode(text))[1:]  # the bytes typed: '\xff', not a surrogate
        except UnicodeEncodeError:
            shown = ascii(text)
        raise BadOption(option, f"must be at most {MAX_ID_PREFIX} printable ASCII characters without spaces "
                                f"(it goes into the X-Request-Id header), got {_shown(shown)}")
    return text


def given(ctx: click.Context, name: str) -> bool:
    """Whether the option whose parameter is ``name`` was given by the user
    (command line or environment), not left at its default: an option
    that does nothing in the combination given is refused, never ignored."""
    source = ctx.get_parameter_source(name)
    return source is not None and source not in (click.core.ParameterSource.DEFAULT,
                                                 click.core.ParameterSource.DEFAULT_MAP)


def refuse_given(ctx: click.Context, names: dict[str, str], reason: str) -> None:
    """BadOption for the first of ``names`` (parameter -> option as typed)
    the user gave: ``reason`` says why it would do nothing here."""
    from traces.errors import BadOption

    for param, option in names.items():
        if given(ctx, param):
            raise BadOption(option, reason)


def refuse_non_utf8(paths: dict[str, object]) -> None:
    """BadOption for the first path (option -> path or paths) whose name is
    not UTF-8 (Python holds such bytes as surrogates: ``os.fsdecode(b"x\\xff")``).
    latroute stores paths and names derived from them (a profile's name is
    its file's stem) in Parquet and JSON, which take UTF-8 only: such a name
    once failed deep inside pyarrow as an internal ``UnicodeEncodeError``.
    Refused at the entry, before any work."""
    from traces.errors import BadOption

    for option, value in paths.items():
        for p in value if isinstance(value, list | tuple) else [value]:
            if p is None:
                continue
            try:
                str(p).encode("utf-8")
            except UnicodeEncodeError:
                shown = os.fsencode(str(p)).decode("utf-8", "backslashreplace")
                raise BadOption(option, f"the path {shown} is not valid UTF-8: rename it (latroute writes paths "
                                        "and names into UTF-8 files)") from None
