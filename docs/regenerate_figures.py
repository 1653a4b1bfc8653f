"""Regenerate every image under docs/ from the command named on its page.

    python docs/regenerate_figures.py            # full size, into docs/images/
    python docs/regenerate_figures.py --small    # reduced size (CI), into a temporary directory
    python docs/regenerate_figures.py --out DIR  # into DIR instead of docs/

A page that shows figures declares where they come from, in an HTML
comment directly above the ```bash block that makes them:

    <!-- figures: images/a.png=OUT/report/a.png images/b.png=screenshot:OUT/report/x.html -->
    ```bash
    latroute demo --out OUT
    ```

The script runs that block, as written, in a fresh temporary directory
(with latroute's root on PYTHONPATH), then copies each named output file
to the image path (relative to docs/), or, for ``screenshot:``, opens the
HTML file in headless Chromium and saves one window of it. The command is
read from the page, so a page cannot name a command its figures do not
come from. ``--small`` takes the screenshots in a smaller window; the
commands themselves run as the page states them (the demo has no size
option and takes under a few minutes on 2 cores). tests/project/test_docs_figures.py
runs ``--small`` and checks that every image under docs/ is declared by a
page and comes out of its command.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
FULL_WINDOW, SMALL_WINDOW = (1400, 900), (1000, 700)
_DECL = re.compile(r"<!--\s*figures:\s*(.*?)\s*-->\s*\n```bash\n(.*?)^```", re.S | re.M)


@dataclass
class FigureBlock:
    page: Path                      # the page, relative to docs/
    images: dict[str, str]          # image path (relative to docs/) -> source (output path or screenshot:path)
    command: str                    # the bash block, as the page shows it


def declared_blocks() -> list[FigureBlock]:
    """Every figures declaration of every page under docs/, in path order."""
    out = []
    for page in sorted(DOCS.rglob("*.md")):
        for m in _DECL.finditer(page.read_text()):
            images = dict(item.split("=", 1) for item in m.group(1).split())
            out.append(FigureBlock(page.relative_to(DOCS), images, m.group(2)))
    return out


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def screenshot(html: Path, png: Path, window: tuple[int, int]) -> None:
    exe = chromium()
    if exe is None:
        raise SystemExit("error: a screenshot needs headless Chromium (apt-get install chromium)")
    png.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        f"--user-data-dir={profile}", "--virtual-time-budget=10000",
                        f"--window-size={window[0]},{window[1]}", f"--screenshot={png}", html.resolve().as_uri()],
                       check=True, capture_output=True, timeout=300)
    if not png.is_file() or png.stat().st_size == 0:
        raise SystemExit(f"error: chromium wrote no screenshot of {html}")


def run_block(block: FigureBlock, dest: Path, window: tuple[int, int]) -> list[Path]:
    """Run one page's command in a temporary directory; write its images under ``dest``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    written = []
    with tempfile.TemporaryDirectory(prefix="latroute-figures-") as tmp:
        print(f"{block.page}: {block.command.strip()}", flush=True)
        proc = subprocess.run(["bash", "-euo", "pipefail", "-c", block.command], cwd=tmp, env=env,
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"error: {block.page}: the figures' command failed (exit {proc.returncode}):\n"
                             f"{proc.stderr[-3000:]}")
        for image, source in block.images.items():
            target = dest / image
            target.parent.mkdir(parents=True, exist_ok=True)
            if source.startswith("screenshot:"):
                screenshot(Path(tmp) / source.removeprefix("screenshot:"), target, window)
            else:
                made = Path(tmp) / source
                if not made.is_file():
                    raise SystemExit(f"error: {block.page}: {source} was not made by its command")
                shutil.copyfile(made, target)
            print(f"  wrote {target}", flush=True)
            written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="reduced size (CI): smaller screenshots, not into docs/")
    ap.add_argument("--out", type=Path, help="write the images under this directory instead of docs/")
    args = ap.parse_args(argv)
    dest = args.out or (Path(tempfile.mkdtemp(prefix="latroute-figures-small-")) if args.small else DOCS)
    window = SMALL_WINDOW if args.small else FULL_WINDOW
    blocks = declared_blocks()
    if not blocks:
        raise SystemExit("error: no page declares figures")
    for block in blocks:
        run_block(block, dest, window)
    print(f"images under {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
