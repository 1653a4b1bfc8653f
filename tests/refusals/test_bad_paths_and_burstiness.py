"""Bad input that crosses several modules: an output path that is not UTF-8, refused before the
work, and burstiness held to its documented range by every command that takes it."""
from __future__ import annotations

import os

import pytest

from tests.support.clean_refusal import refused_cleanly

NON_UTF8 = os.fsdecode(b"out\xff")


@pytest.mark.parametrize("args", [
    ["trace", "generate", "--requests", "5", "--rate", "1"],
    ["replay", "--requests", "20", "--rate", "4"],
], ids=["trace-generate", "replay"])
def test_a_non_utf8_output_path_is_refused_before_the_work(tmp_path, args):
    """main: trace generate exited 0 after printing the encoder's error;
    replay ended in an internal UnicodeEncodeError after its run."""
    refused_cleanly([*args, "--out", tmp_path / NON_UTF8], [tmp_path], "--out", "not valid UTF-8", "out\\xff")


@pytest.mark.parametrize("args", [
    ["trace", "generate", "--requests", "5", "--rate", "1"],
    ["loadgen", "--base-url", "http://127.0.0.1:9", "--num-prompts", "2", "--time-limit", "5"],
], ids=["trace-generate", "loadgen"])
def test_burstiness_has_its_documented_range_everywhere(tmp_path, args):
    refused_cleanly([*args, "--burstiness", "1e-300", "--out", tmp_path / "o"], [tmp_path], "--burstiness",
                    "[0.01, 100]")
