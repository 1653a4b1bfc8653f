"""``record finish`` neither drops, follows nor waits, and removes parts only
after the joined recording is written and verified."""
from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import run_cli
from tests.support.clean_refusal import refused_cleanly
from traces.vllm_recorder.files import REQUEST_FIELDS

STEP = '{"step": %d, "start_s": %d, "end_s": %d, "items": [], "preempted": []}\n'


def _recording(d: Path) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "engine.json").write_text(json.dumps({"budget": 512, "max_seqs": 64, "block_size": 128,
                                               "num_kv_blocks": 1000, "model": "m", "vllm_version": "0.32.0"}))
    (d / "steps.00000.jsonl").write_text(STEP % (0, 0, 1))
    return d


def _rows(n: int, fields: int = len(REQUEST_FIELDS)) -> str:
    return "".join(",".join([f"r{i}", f"{0.1 * i:.1f}"] + ["1"] * (fields - 2)) + "\n" for i in range(n))


def test_a_part_beside_an_older_requests_csv_is_refused_not_emptied(tmp_path):
    rec = _recording(tmp_path / "rec")
    old = [f for f in REQUEST_FIELDS if f not in ("client_id", "status")]
    (rec / "requests.csv").write_text(",".join(old) + "\n" + _rows(100, len(old)))
    (rec / "requests.00000.csv").write_text(",".join(REQUEST_FIELDS) + "\n" + _rows(100))
    refused_cleanly(["record", "finish", rec], [rec], "requests.00000.csv:1", "header", "12 columns")


def test_a_row_with_another_field_count_is_refused_with_its_row(tmp_path):
    rec = _recording(tmp_path / "rec")
    (rec / "requests.00000.csv").write_text(",".join(REQUEST_FIELDS) + "\n" + _rows(3) + "r9,0.5,1\n" + _rows(2))
    refused_cleanly(["record", "finish", rec], [rec], "requests.00000.csv:5", "fields")


@pytest.mark.parametrize("make, fragment", [
    (lambda p: os.symlink(p.parent.parent / "elsewhere.jsonl", p), "symbolic link"),
    (lambda p: os.mkfifo(p), "named pipe"),
    (lambda p: p.mkdir(), "directory"),
    (lambda p: p.write_bytes(b'{"step": 1, "start_s": 1, "end_s": 2, "items": ["\xe9"]}\n'), "not UTF-8"),
    (lambda p: p.write_bytes(b"garbage \x01\x02 line\n"), "not a step record"),
], ids=["symlink", "fifo", "directory", "latin1", "garbage"])
def test_a_special_or_malformed_part_is_refused_and_nothing_removed(tmp_path, make, fragment):
    rec = _recording(tmp_path / "d" / "rec")
    (tmp_path / "d" / "elsewhere.jsonl").write_text(STEP % (5, 5, 6))
    make(rec / "steps.00001.jsonl")
    before = sorted(os.listdir(rec))
    done: dict = {}
    t = threading.Thread(target=lambda: done.setdefault("line", refused_cleanly(
        ["record", "finish", rec], [], "steps.00001.jsonl", fragment)), daemon=True)
    t.start()
    t.join(timeout=20)
    if t.is_alive():  # a FIFO blocked the open: free it, then fail
        with open(rec / "steps.00001.jsonl", "w"):
            pass
        t.join(timeout=5)
        pytest.fail("record finish waited on a FIFO named like a part")
    assert "line" in done, "the refusal assertion failed (see the thread's exception above)"
    assert sorted(os.listdir(rec)) == before and not (rec / "steps.jsonl").exists()
    assert (tmp_path / "d" / "elsewhere.jsonl").read_text() == STEP % (5, 5, 6)


def test_a_device_named_like_a_part_is_refused(tmp_path):
    rec = _recording(tmp_path / "rec")
    try:
        os.mknod(rec / "requests.00000.csv", stat.S_IFCHR | 0o600, os.makedev(1, 3))  # /dev/null's numbers
    except PermissionError:
        os.symlink("/dev/null", rec / "requests.00000.csv")  # not root: the link to one instead
    refused_cleanly(["record", "finish", rec], [rec], "requests.00000.csv")
    assert os.path.lexists(rec / "requests.00000.csv") and os.path.exists(rec / "steps.00000.jsonl")


def test_good_parts_are_joined_verified_and_then_removed(tmp_path):
    rec = _recording(tmp_path / "rec")
    (rec / "steps.00001.jsonl").write_text(STEP % (1, 1, 2) + '{"step": 2, "sta')  # cut by a crash
    (rec / "requests.00000.csv").write_text(",".join(REQUEST_FIELDS) + "\n" + _rows(3))
    (rec / "requests.00001.csv").write_text(",".join(REQUEST_FIELDS) + "\n" + "r7,0.05" + ",1" * 10 + "\nr8,0.")
    res = run_cli("record", "finish", rec)
    assert res.exit_code == 0, res.output
    assert (rec / "steps.jsonl").read_text() == STEP % (0, 0, 1) + STEP % (1, 1, 2)
    req = pd.read_csv(rec / "requests.csv", dtype=str, keep_default_na=False)
    assert list(req.columns) == list(REQUEST_FIELDS) and list(req["id"]) == ["r0", "r7", "r1", "r2"]
    assert sorted(os.listdir(rec)) == ["engine.json", "requests.csv", "steps.jsonl"]


def test_parts_stay_when_the_joined_file_does_not_read_back(tmp_path, monkeypatch):
    from traces.vllm_recorder import finish
    from traces.vllm_recorder.files import finish_recording

    rec = _recording(tmp_path / "rec")
    monkeypatch.setattr(finish, "_digest", lambda path: b"not what was written")
    with pytest.raises(OSError, match="read back"):
        finish_recording(rec)
    assert sorted(os.listdir(rec)) == ["engine.json", "steps.00000.jsonl"]  # the part kept, no temporary left
