"""Every image under docs/ comes out of the command its page names.

A page declares its figures above the ```bash block that makes them
(docs/regenerate_figures.py). The static checks are fast and run in the
default suite: every image under docs/ is declared by exactly one page, and
a page shows only images it declares. The marked test (``-m docs``) runs
``regenerate_figures.py --small`` — every page's own command — and checks
that each declared image comes out of it."""
from __future__ import annotations

import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "docs"))
import regenerate_figures as rf  # noqa: E402

DOCS = REPO / "docs"
IMAGE_EXT = (".png", ".jpg", ".jpeg", ".svg", ".gif", ".webp")


def png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", head[16:24])


def test_every_image_is_declared_by_one_page():
    declared: dict[str, Path] = {}
    for block in rf.declared_blocks():
        for image in block.images:
            assert image not in declared, f"{image} declared by {declared[image]} and {block.page}"
            declared[image] = block.page
    on_disk = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*") if p.suffix.lower() in IMAGE_EXT}
    assert on_disk == set(declared), ("images without a page and command", on_disk - set(declared),
                                      "declared but missing", set(declared) - on_disk)


def test_pages_show_only_images_they_declare():
    blocks = rf.declared_blocks()
    for page in DOCS.rglob("*.md"):
        own = {img for b in blocks if DOCS / b.page == page for img in b.images}
        for ref in re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", page.read_text()):
            image = (page.parent / ref).resolve().relative_to(DOCS).as_posix()
            assert image in own, f"{page.relative_to(DOCS)} shows {image} without naming the command it comes from"


def test_each_command_is_on_its_page():
    for block in rf.declared_blocks():
        text = (DOCS / block.page).read_text()
        assert f"```bash\n{block.command}```" in text
        assert block.command.strip().startswith("latroute "), block.command


@pytest.mark.docs
def test_figures_come_out_of_their_pages_commands(tmp_path):
    if rf.chromium() is None:
        pytest.skip("headless Chromium not installed (the screenshot needs it)")
    out = tmp_path / "figures"
    proc = subprocess.run([sys.executable, str(DOCS / "regenerate_figures.py"), "--small", "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    for block in rf.declared_blocks():
        for image, source in block.images.items():
            made = out / image
            assert made.is_file() and made.stat().st_size > 0, f"{image} did not come out of: {block.command}"
            w, h = png_size(made)
            if source.startswith("screenshot:"):
                assert (w, h) == rf.SMALL_WINDOW, (image, w, h)
            else:  # a copy of what the command wrote: the committed image has its size
                assert (w, h) == png_size(DOCS / image), (image, (w, h), png_size(DOCS / image))
