"""Shared pieces of the fuzzers: corruptors for every input
format, the promise a reading command must keep on each corrupted input,
and runners that survive a crashing command.

Why a separate oracle from ``tests.support.clean_refusal.refused_cleanly``: a random
corruption may leave the input valid (a digit changed into another digit, a
BOM the readers strip), so the fuzzers accept *either* a clean success
(exit 0, output valid, inputs unchanged) *or* a clean refusal (exit 2, one
``error:`` line naming the corrupted file, no traceback, no "internal
error", inputs unchanged, nothing written). Everything else breaks the
promise: exit 1 with "internal error", a traceback, a signal (Numba heap
corruption kills the process, so crash-prone commands run in a worker
process), a hang (every run has a deadline), a changed input, a half output.

Every strategy draws from ``hypothesis`` with ``derandomize=True`` and no
example database, so the same code gives the same cases and a failure
reproduces from its printed draws.

The default suite runs a few examples of each (the cheap, in-process
commands); ``pytest -m fuzz`` runs the campaigns, bounded in time by
LATROUTE_FUZZ_SECONDS (their total, 480 s by default), each printing how
many cases it ran; LATROUTE_FUZZ_LOG=FILE appends every broken promise and
each campaign's count to FILE (a campaign keeps going after a failure).
"""
from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.errors import Flaky

from tests.support.clean_refusal import tree_state


# the default suite: few examples each (the whole default part stays within ~20 s)
def quick(examples: int = 8) -> settings:
    """A default-suite fuzzer: few examples, derandomized, no database."""
    return settings(max_examples=examples, deadline=None, derandomize=True, database=None, print_blob=True,
                    suppress_health_check=list(HealthCheck))


QUICK = quick()


def campaign_seconds(share: float) -> float:
    """This campaign's share of LATROUTE_FUZZ_SECONDS: 480 s by default, so
    that with the fixed-size runs (plug-in faults, special files: about two
    minutes) the whole ``-m fuzz`` run takes about ten minutes here. The
    recordings campaign takes 0.4 of it; LATROUTE_FUZZ_SECONDS=1500 gives
    it ten minutes."""
    return float(os.environ.get("LATROUTE_FUZZ_SECONDS", "480")) * share


def long_settings(examples: int) -> settings:
    """A ``-m fuzz`` campaign: many examples, still derandomized; generation
    only (a campaign keeps every broken promise itself, nothing to shrink)."""
    return settings(max_examples=examples, deadline=None, derandomize=True, database=None, print_blob=True,
                    suppress_health_check=list(HealthCheck), phases=[Phase.generate])


# ----------------------------------------------------------------- values
HOSTILE_NUMBERS = ["NaN", "nan", "inf", "-inf", "Infinity", "-1", "0", "-0", "1e300", "-1e300", "1e-300",
                   str(2**63), str(2**63 - 1), str(2**62), "9" * 400, "0x10", "1_000", "1,5", ""]
HOSTILE_TYPES = ['"x"', '"false"', '""', "[]", "[1, 2]", "null", "{}", '{"a": 1}', "true", "false"]
INSERTS = [b"\x00", b"\xff", b"\xc3", b",", b"\n", b"\r", b'"', b"{", b"]", b"\t", b";", b"\xef\xbb\xbf",
           "é".encode("latin-1"), b"-", b"."]
DEEP = "[" * 1000 + "]" * 1000
DEEP_OBJ = '{"a": ' * 1000 + "1" + "}" * 1000
NUMBER = re.compile(rb"(?<![\w.])-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?(?![\w.])")
JSON_VALUE = re.compile(rb'(?<=: )("(?:[^"\\]|\\.)*"|-?\d[\d.eE+-]*|true|false|null)')


def _near(num: bytes, k: int) -> bytes:
    """A plausible number near ``num``: what passes a syntax check but may
    contradict the rest of the file (a length, a time, a limit)."""
    v = float(num)
    cands = [v * 2, v / 2, v + 1, v - 1, 0.0, 1.0, v * 10, v + 0.5, v * 1e6, -v]
    w = cands[k % len(cands)]
    return (str(int(w)) if w == int(w) and b"." not in num and b"e" not in num.lower() else repr(w)).encode()


def _lines(raw: bytes) -> list[bytes]:
    return raw.splitlines(keepends=True) or [b""]


KINDS_TEXT = ["flip", "delete", "insert", "truncate", "number", "near", "dup-line", "del-line", "swap-lines",
              "latin1", "utf16", "bom", "long-line", "empty", "crlf"]
KINDS_JSON = KINDS_TEXT + ["type", "deep", "deep-obj"]
KINDS_CSV = KINDS_TEXT + ["drop-column", "extra-column", "extra-field", "dup-header"]
KINDS_BINARY = ["flip", "delete", "insert", "truncate", "empty", "zero-block"]


def corrupt(data: st.DataObject, raw: bytes, kinds: list[str]) -> tuple[str, bytes]:
    """One corruption of ``raw`` drawn from ``kinds``, at a drawn position;
    returns (description, new bytes). Every draw is labelled, so a failure
    prints how to rebuild it."""
    kind = data.draw(st.sampled_from(kinds), label="kind")
    n = max(len(raw), 1)
    if kind == "flip":
        i = data.draw(st.integers(0, n - 1), label="at")
        x = data.draw(st.integers(1, 255), label="xor")
        out = bytearray(raw or b"\0")
        out[i] ^= x
        return f"flip byte {i} ^ {x}", bytes(out)
    if kind == "delete":
        i = data.draw(st.integers(0, n - 1), label="at")
        k = data.draw(st.integers(1, 64), label="count")
        return f"delete {k} bytes at {i}", raw[:i] + raw[i + k:]
    if kind == "insert":
        i = data.draw(st.integers(0, n), label="at")
        chunk = data.draw(st.sampled_from(INSERTS) | st.binary(min_size=1, max_size=8), label="bytes")
        return f"insert {chunk!r} at {i}", raw[:i] + chunk + raw[i:]
    if kind == "truncate":
        i = data.draw(st.integers(0, n - 1), label="at")
        return f"truncate at {i}", raw[:i]
    if kind == "zero-block":
        i = data.draw(st.integers(0, n - 1), label="at")
        return f"zero 512 bytes at {i}", raw[:i] + b"\0" * min(512, n - i) + raw[i + 512:]
    if kind == "empty":
        return "empty file", b""
    if kind in ("number", "near", "type"):
        pat = JSON_VALUE if kind == "type" else NUMBER
        spots = list(pat.finditer(raw))
        if not spots:
            return corrupt(data, raw, ["flip"])
        m = spots[data.draw(st.integers(0, len(spots) - 1), label="which")]
        if kind == "number":
            new = data.draw(st.sampled_from(HOSTILE_NUMBERS), label="value").encode()
        elif kind == "near":
            new = _near(m.group(), data.draw(st.integers(0, 9), label="how"))
        else:
            new = data.draw(st.sampled_from(HOSTILE_TYPES), label="value").encode()
        return f"{kind}: {m.group()[:40]!r} at {m.start()} -> {new[:40]!r}", raw[:m.start()] + new + raw[m.end():]
    if kind in ("deep", "deep-obj"):
        spots = list(JSON_VALUE.finditer(raw))
        if not spots:
            return corrupt(data, raw, ["flip"])
        m = spots[data.draw(st.integers(0, len(spots) - 1), label="which")]
        return f"{kind} at {m.start()}", raw[:m.start()] + (DEEP if kind == "deep" else DEEP_OBJ).encode() + raw[m.end():]
    lines = _lines(raw)
    i = data.draw(st.integers(0, len(lines) - 1), label="line")
    if kind == "dup-line":
        j = data.draw(st.integers(0, len(lines)), label="to")
        return f"line {i + 1} copied before line {j + 1}", b"".join(lines[:j] + [lines[i]] + lines[j:])
    if kind == "del-line":
        return f"line {i + 1} deleted", b"".join(lines[:i] + lines[i + 1:])
    if kind == "swap-lines":
        j = data.draw(st.integers(0, len(lines) - 1), label="with")
        lines[i], lines[j] = lines[j], lines[i]
        return f"lines {i + 1} and {j + 1} swapped", b"".join(lines)
    if kind == "latin1":
        return f"latin-1 'é' in line {i + 1}", b"".join(lines[:i] + ["é".encode("latin-1") + lines[i]] + lines[i + 1:])
    if kind == "utf16":
        return "re-encoded UTF-16", raw.decode("utf-8", "replace").encode("utf-16")
    if kind == "bom":
        return "UTF-8 BOM", b"\xef\xbb\xbf" + raw
    if kind == "crlf":
        return "CRLF line ends", raw.replace(b"\r\n", b"\n").replace(b"\n", b"\r\n")
    if kind == "long-line":
        return f"2 MB line before line {i + 1}", b"".join(lines[:i] + [b"7" * (2 << 20) + b"\n"] + lines[i:])
    # CSV kinds
    rows = [ln.rstrip(b"\r\n").split(b",") for ln in lines]
    width = len(rows[0])
    c = data.draw(st.integers(0, max(width - 1, 0)), label="column")
    if kind == "drop-column":
        return f"column {c + 1} dropped", b"".join(b",".join(r[:c] + r[c + 1:]) + b"\n" for r in rows)
    if kind == "extra-column":
        return "extra column", b"".join(b",".join(r + [b"extra" if k == 0 else b"1"]) + b"\n" for k, r in enumerate(rows))
    if kind == "extra-field":
        rows[i] = rows[i] + [b"9"]
        return f"extra field on line {i + 1}", b"".join(b",".join(r) + b"\n" for r in rows)
    if kind == "dup-header":
        rows[0] = rows[0] + [rows[0][c]]
        return f"header column {c + 1} duplicated", b"".join(b",".join(r) + b"\n" for r in rows)
    raise AssertionError(kind)


def kinds_for(path: Path) -> list[str]:
    """The corruptions that make sense for a file, by its name."""
    name = path.name
    if name.endswith(".parquet"):
        return KINDS_BINARY
    if name.endswith((".json", ".jsonl", ".toml")):
        return KINDS_JSON
    if name.endswith(".csv"):
        return KINDS_CSV
    return KINDS_TEXT


SEMANTIC = ["near", "near", "number", "dup-line", "del-line"]


def corrupt_one_file(data: st.DataObject, root: Path, files: list[Path] | None = None,
                     semantic: float = 0.0) -> tuple[Path, str]:
    """Corrupt one drawn file under ``root`` in place; returns it and how.
    With ``semantic`` > 0, that share of the cases draws from the
    corruptions that keep the syntax and break the meaning (a number moved
    near its value, a row copied or lost): the ones that pass a reader and
    contradict the other files, which is what reaches compiled code."""
    files = files if files is not None else sorted(p for p in root.rglob("*") if p.is_file())
    target = data.draw(st.sampled_from(files), label="file")
    meaning = semantic > 0 and data.draw(st.integers(0, 99), label="semantic") < semantic * 100
    how, new = corrupt(data, target.read_bytes(), SEMANTIC if meaning else kinds_for(target))
    target.write_bytes(new)
    return target, how


# the runners (in process, child process, worker) live in tests/support/fuzz_runners.py
from tests.support.fuzz_runners import HUNG, Outcome, Worker, in_process, subprocess_run, worker_main  # noqa: E402,F401


# ---------------------------------------------------------------- promise
def broken_promise(o: Outcome, names: list[str], before: dict, watch: list[Path], out: Path | None,
                   valid: Callable[[Path], None] | None = None, ok_codes: tuple = (0,),
                   writes_inputs: bool = False) -> str | None:
    """None if ``o`` kept the promise, else what broke (one line, for
    findings.md). Accepted = an exit in ``ok_codes``, ``valid(out)`` holds;
    refused = exit 2, one ``error:`` line naming one of ``names``, nothing
    written. Either way: no traceback, no internal error, inputs unchanged
    (``writes_inputs``: a command that completes its input, as ``sweep
    --resume`` and ``record finish`` do, may change it when it succeeds)."""
    lines = [ln for ln in o.stderr.splitlines() if ln.strip()]
    first = lines[0][:200] if lines else ""
    if o.code == HUNG:
        return "hang (killed at the deadline)"
    if o.code < 0:
        sig = signal.Signals(-o.code).name if -o.code in signal.Signals._value2member_map_ else str(o.code)
        tail = [ln for ln in o.stderr.splitlines() if ln.strip()][-1:] or [""]
        return f"crash ({sig}) {tail[0][:160]}"
    if "Traceback" in o.text:
        return f"traceback, exit {o.code}: {[ln for ln in o.text.splitlines() if ln.strip()][-1][:200]}"
    if "internal error" in o.text:
        return f"exit {o.code}, {first}"
    changed = sorted(set(before.items()) ^ set(tree_state(*watch).items()))
    if changed and not (writes_inputs and o.code in ok_codes):
        return f"exit {o.code}, input changed: {changed[0][0]}"
    if o.code == 2:
        if len(lines) != 1 or not lines[0].startswith("error: "):
            return f"exit 2 with {len(lines)} stderr lines: {first}"
        if not any(n in lines[0] for n in names):
            return f"exit 2 but the file is not named: {first}"
        if out is not None and (os.path.lexists(out) or
                                any(p.name.startswith(f".{out.name}.") for p in out.parent.iterdir())):
            return f"exit 2 but output written: {first}"
        return None
    if o.code in ok_codes:
        if valid is not None and out is not None:
            try:
                valid(out)
            except Exception as e:  # noqa: BLE001 - the output is what is being judged
                return f"exit {o.code} but output invalid: {type(e).__name__}: {str(e)[:120]}"
        return None
    return f"exit {o.code}: {first}"


def record(line: str) -> None:
    """Append a finding to LATROUTE_FUZZ_LOG (when set): the campaigns log
    every broken promise there, not only the first, for a report."""
    log = os.environ.get("LATROUTE_FUZZ_LOG")
    if log:
        with open(log, "a", encoding="utf-8") as f:
            f.write(line.replace("\n", " ") + "\n")


class CampaignOver(Exception):
    """Raised by ``Campaign.tick`` when the time is up: hypothesis sees one
    failing example that fails again at once on every replay (no draw is
    made), so it stops; ``Campaign.run`` swallows it. (Returning early
    instead makes hypothesis refuse the run as a flaky strategy.)"""


class Campaign:
    """A ``-m fuzz`` campaign bounded in time: every case judged, every
    broken promise kept (not only the first: hypothesis would stop and
    shrink, through subprocesses), the count printed and logged."""

    def __init__(self, name: str, seconds: float) -> None:
        self.name, self.deadline = name, time.monotonic() + seconds
        self.cases, self.broken = 0, []

    def over(self) -> bool:
        return time.monotonic() > self.deadline

    def tick(self) -> None:
        if self.over():
            raise CampaignOver(self.name)

    def run(self, body: Callable[[], None], *workers: Worker) -> None:
        """Run the ``@given`` body until the time is up, then close the workers.
        Hypothesis may call the stop flaky (a choice sequence it saw go on
        now stops at once): after the deadline that is the stop itself, and
        nothing is lost, every case was judged as it ran."""
        try:
            body()
        except (CampaignOver, Flaky):
            if not self.over():
                raise
        finally:
            for w in workers:
                w.close()

    def judge(self, what: str, problem: str | None) -> None:
        self.cases += 1
        if problem is not None:
            self.broken.append(f"{what} → {problem}")
            record(f"{self.name}: {what} → {problem}")

    def finish(self) -> None:
        summary = f"fuzz campaign {self.name}: {self.cases} cases, {len(self.broken)} broken promises"
        print(summary)
        record(summary)
        assert self.cases > 0, f"{self.name}: no case ran"
        assert not self.broken, summary + "\n" + "\n".join(self.broken[:40])
