"""The engine settings of a request-level import: every one given, inferred or defaulted (vLLM's
documented default for the trace's version and GPU class, docs/reference/engine-defaults.md), a feature
the kernel does not model refused by name unless accepted, and what the harness replays from them."""
from __future__ import annotations

import json
import re
import shutil

from harness.requestlevel.engine_options import (
    REQUEST_TRACE_DEFAULTS,
    engine_lines,
    request_engine_marked,
    trace_caveats,
    trace_engine,
)
from tests.conftest import REPO, assert_refused, run_cli, shared
from traces.importers.engine_settings import SETTINGS
from traces.store import open_trace
from traces.vllm_releases.defaults import (
    BY_VERSION,
    FALLBACK_VERSION,
    RELEASES,
    TREE,
    engine_defaults,
    gpu_class,
    release_for,
    table_rows,
)
from traces.vllm_releases.versions import CHECKED_VLLM_VERSIONS


def _reqstats_copy(tmp_path, edit) -> object:
    """A copy of the shared RTX 4090 vllm-reqstats run with its meta.json edited by ``edit(meta)``."""
    src = shared("vllm_gpu_llmservingsim", "RTX4090_Llama-3.1-8B")
    d = tmp_path / "run"
    d.mkdir(parents=True)
    for name in ("requests.jsonl", "timeseries.csv"):
        shutil.copy(src / name, d / name)
    meta = json.loads((src / "meta.json").read_text())
    edit(meta)
    (d / "meta.json").write_text(json.dumps(meta))
    return d


def _data_parallel(meta: dict, dp: int = 2, ep: bool = False) -> None:
    meta["engine_kwargs"]["data_parallel_size"] = dp
    meta["resolved_config"]["parallel_config"]["data_parallel_size"] = dp
    meta["engine_kwargs"]["enable_expert_parallel"] = ep
    meta["resolved_config"]["parallel_config"]["enable_expert_parallel"] = ep


def test_data_parallel_run_is_refused_by_name_and_accepted_with_gpus_tp_times_dp(tmp_path):
    src = _reqstats_copy(tmp_path, _data_parallel)
    out = tmp_path / "t"
    assert_refused(run_cli("trace", "import", "vllm-reqstats", src, "--out", out), out,
                   "meta.json: resolved_config.parallel_config.data_parallel_size: 2: data parallelism",
                   "--accept-unmodelled data_parallel_size")
    res = run_cli("trace", "import", "vllm-reqstats", src, "--out", out, "--accept-unmodelled", "data_parallel_size")
    assert res.exit_code == 0, res.output
    t = open_trace(out)
    eng = t.meta["engine"]
    tp = eng["settings"]["tensor_parallel_size"]
    assert (tp, eng["settings"]["data_parallel_size"]) == (1, 2)
    assert eng["settings"]["gpus"] == tp * 2 == 2 and eng["marks"]["gpus"] == "inferred"
    assert eng["accepted_unmodelled"] == ["data_parallel_size"]
    assert eng["not_modelled"][0].startswith("resolved_config.parallel_config.data_parallel_size = 2: data parallel")
    assert "engine gpus = 2  [inferred] tensor_parallel_size x pipeline_parallel_size x data_parallel_size = " \
           "1 x 1 x 2" in res.output
    info = run_cli("trace", "info", out)
    assert "not modelled   data_parallel_size (accepted at import" in info.output
    # results made from the trace carry it
    assert trace_caveats([t])["accepted_unmodelled"] == ["data_parallel_size"]


def test_expert_parallel_is_refused_by_name_too(tmp_path):
    src = _reqstats_copy(tmp_path, lambda m: _data_parallel(m, 2, ep=True))
    out = tmp_path / "t"
    res = run_cli("trace", "import", "vllm-reqstats", src, "--out", out, "--accept-unmodelled", "data_parallel_size")
    assert_refused(res, out, "resolved_config.parallel_config.enable_expert_parallel: true: expert parallelism",
                   "--accept-unmodelled enable_expert_parallel")
    res = run_cli("trace", "import", "vllm-reqstats", src, "--out", out, "--accept-unmodelled", "data_parallel_size",
                  "--accept-unmodelled", "enable_expert_parallel")
    assert res.exit_code == 0, res.output
    eng = open_trace(out).meta["engine"]
    assert eng["accepted_unmodelled"] == ["data_parallel_size", "enable_expert_parallel"]


def test_other_unmodelled_features_and_bad_accept_keys(tmp_path):
    cases = [
        ("spec", lambda m: m["resolved_config"].update(speculative_config={"method": "eagle"}),
         "resolved_config.speculative_config", "speculative_config"),
        ("lmcache", lambda m: m["resolved_config"].update(kv_transfer_config={"kv_connector": "LMCacheConnectorV1"}),
         "resolved_config.kv_transfer_config", "lmcache"),
        ("pd", lambda m: m["resolved_config"].update(kv_transfer_config={"kv_connector": "NixlConnector"}),
         "resolved_config.kv_transfer_config", "kv_transfer_config"),
        ("lora", lambda m: m["engine_kwargs"].update(enable_lora=True), "engine_kwargs.enable_lora", "enable_lora"),
        ("offload", lambda m: m["resolved_config"]["cache_config"].update(kv_offloading_size=8.0),
         "resolved_config.cache_config.kv_offloading_size", "kv_offloading"),
        ("prio", lambda m: m["resolved_config"]["scheduler_config"].update(policy="priority"),
         "resolved_config.scheduler_config.policy", "policy"),
    ]
    for name, edit, where, key in cases:
        src = _reqstats_copy(tmp_path / name, edit)
        out = tmp_path / name / "t"
        assert_refused(run_cli("trace", "import", "vllm-reqstats", src, "--out", out), out,
                       f"meta.json: {where}:", f"--accept-unmodelled {key}")
    out = tmp_path / "x"
    assert_refused(run_cli("trace", "import", "vllm-reqstats", src, "--out", out, "--accept-unmodelled", "warp_drive"),
                   out, "--accept-unmodelled: 'warp_drive' is not one of data_parallel_size")
    assert_refused(run_cli("trace", "import", "azure", src / "meta.json", "--out", out, "--accept-unmodelled",
                           "policy"), out, "--accept-unmodelled: only with FORMAT")
    # data parallelism stated at import is refused the same way
    plain = _reqstats_copy(tmp_path / "plain", lambda m: None)
    assert_refused(run_cli("trace", "import", "vllm-reqstats", plain, "--out", out, "--engine",
                           "data_parallel_size=4"), out, "--engine data_parallel_size: 4",
                   "--accept-unmodelled data_parallel_size")


def test_an_unknown_version_is_defaulted_to_032_and_a_stated_one_picks_its_row(tmp_path):
    def strip(meta):
        del meta["vllm_version"], meta["started_at"]  # no version, and no date to bound it
        meta["resolved_config"]["scheduler_config"].pop("async_scheduling")
        meta["resolved_config"]["scheduler_config"].pop("max_num_seqs")
        meta["engine_kwargs"].pop("max_num_seqs")

    src = _reqstats_copy(tmp_path, strip)
    res = run_cli("trace", "import", "vllm-reqstats", src, "--out", tmp_path / "a")
    assert res.exit_code == 0, res.output
    eng = open_trace(tmp_path / "a").meta["engine"]
    assert (eng["settings"]["vllm_version"], eng["marks"]["vllm_version"]) == ("0.32.0", "defaulted")
    assert eng["marks"]["async_scheduling"] == "defaulted" and eng["settings"]["async_scheduling"] is True
    assert "v0.32.0/vllm/engine/arg_utils.py#L2923" in eng["sources"]["max_num_seqs"]
    assert eng["settings"]["max_num_seqs"] == 256  # an RTX 4090 (24 GB): the small row
    assert set(eng["marks"]) == set(SETTINGS) and set(eng["marks"].values()) <= {"given", "inferred", "defaulted"}
    # a version given at import outside the checked window, accepted: 0.10.1.1's defaults (no async scheduler
    # by default), the stated version kept, replayed with 0.19.0's rules
    res = run_cli("trace", "import", "vllm-reqstats", src, "--out", tmp_path / "b", "--engine", "vllm_version=0.10.2",
                  "--accept-unmodelled", "vllm_version")
    assert res.exit_code == 0, res.output
    eng = open_trace(tmp_path / "b").meta["engine"]
    assert eng["marks"]["vllm_version"] == "given" and eng["settings"]["async_scheduling"] is False
    assert eng["settings"]["vllm_version"] == "0.10.2" and "0.10.1.1's defaults" in eng["sources"]["vllm_version"]
    assert eng["accepted_unmodelled"] == ["vllm_version"]
    assert "replayed with the rules of 0.19.0" in eng["not_modelled"][0]
    # no version but the run's date: the scheduling rules are 0.32.0's (defaulted), the engine defaults the
    # newest tabulated release's published by then
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"date": "20250901-100000", "num_prompts": 2, "request_rate": 1.0,
                                 "input_lens": [10, 20], "output_lens": [5, 6], "ttfts": [0.1, 0.2]}))
    res = run_cli("trace", "import", "vllm-bench", bench, "--out", tmp_path / "c")
    assert res.exit_code == 0, res.output
    eng = open_trace(tmp_path / "c").meta["engine"]
    assert (eng["settings"]["vllm_version"], eng["marks"]["vllm_version"]) == ("0.32.0", "defaulted")
    assert eng["sources"]["vllm_version"].startswith("the source states no vLLM version: the scheduling rules "
                                                     "are 0.32.0's")
    assert "engine defaults below from a run on 2025-09-01 ran no release published later: 0.10.1.1's" \
        in eng["sources"]["vllm_version"]
    assert eng["settings"]["async_scheduling"] is False  # 0.10's default


def test_defaults_per_version_and_gpu_class():
    h100, a100_80, a100_40 = gpu_class("NVIDIA-H100-80GB-HBM3"), gpu_class("NVIDIA-A100-SXM4-80GB"), \
        gpu_class("NVIDIA A100-SXM4-40GB")
    assert (h100.key, a100_80.key, a100_40.key) == ("h100", "a100-80", "a100-40")
    assert gpu_class("no-ib-Standard_ND96asr_v4 x 2").key == "a100-40"
    assert gpu_class("NVIDIA GeForce RTX 4090").key == "consumer" and gpu_class("NVIDIA L4").key == "l40s"
    assert gpu_class("NVIDIA B200").key == "b200" and gpu_class(None).key == "unknown"

    def seqs(version, gpu):
        d = engine_defaults(release_for(version).release, gpu)
        return d["max_num_batched_tokens"].value, d["max_num_seqs"].value

    # 0.8.5 keyed on memory alone: an A100-80GB got the large row; from 0.10 A100s are kept in the small one
    assert seqs("0.8.5", a100_80) == (8192, 1024) and seqs("0.10.1.1", a100_80) == (2048, 256)
    assert seqs("0.32.0", h100) == (8192, 1024) and seqs("0.32.0", gpu_class("B200")) == (16384, 1024)
    assert seqs("0.19.0", gpu_class("B200")) == (8192, 1024)  # the >= 160 GiB row came later
    assert seqs("0.32.0", gpu_class(None)) == (2048, 256)  # vLLM's row when it cannot query the device
    assert release_for("0.9.2").release.version == "0.8.5" and "not tabulated" in release_for("0.9.2").how
    assert release_for(None).release.version == "0.32.0" and release_for("latest").release.version == "0.32.0"
    assert release_for(None, "2025-05-08").release.version == "0.8.5" and release_for(None, "2025-05-08").inferred
    assert release_for(None, "2025-04-14").release.version == "0.8.5"  # before every row: the oldest
    assert release_for("0.19.0", "2025-01-01").release.version == "0.19.0"  # a stated version wins
    assert FALLBACK_VERSION == CHECKED_VLLM_VERSIONS[-1] and FALLBACK_VERSION in BY_VERSION  # a checked version has a row
    assert [engine_defaults(r, h100)["async_scheduling"].value for r in RELEASES] == [False, False, True, True]


def test_the_docs_table_is_the_code_table():
    """docs/reference/engine-defaults.md prints every (release, GPU class) row the code holds, with the
    source line of each release."""
    text = (REPO / "docs" / "reference" / "engine-defaults.md").read_text()
    for version, label, budget, seqs, asyn in table_rows():
        row = f"| {version} | {label} | {budget} | {seqs} | {'on' if asyn else 'off'} |"
        assert row in text, row
    for r in RELEASES:
        assert TREE.format(v=r.version, path=r.batch_source) in text, r.version


def test_replay_takes_defaults_under_the_profile_and_given_settings_over_it(tmp_path):
    """What the harness replays: defaulted settings under a profile's fitted engine, given and inferred
    ones over it, --engine over all; each with its mark."""
    from estimators.timemodel.profile import load_profile

    src = shared("vllm_gpu_llmservingsim", "RTXPRO6000_Qwen3-32B")
    assert run_cli("trace", "import", "vllm-reqstats", src, "--out", tmp_path / "p").exit_code == 0
    t = open_trace(tmp_path / "p")
    stated = trace_engine([t])
    assert stated["max_num_seqs"] == 128 and "num_kv_blocks" not in stated  # given; defaulted kept apart
    prof = load_profile("qwen3-8b-h100")
    prof.fitted_on = {"engine": {"max_num_seqs": 64, "num_kv_blocks": 5000}}
    engine, marks = request_engine_marked(prof, {"max_num_batched_tokens": 4096}, stated=stated)
    assert engine.max_num_seqs == 128 and marks["max_num_seqs"].mark == "given"  # the trace over the profile
    assert engine.num_kv_blocks == 5000 and marks["num_kv_blocks"].mark == "inferred"  # the profile over a default
    assert engine.max_num_batched_tokens == 4096 and marks["max_num_batched_tokens"].how == "--engine"
    assert engine.async_scheduling is True and marks["async_scheduling"].mark == "defaulted"
    lines = engine_lines(engine, marks)
    assert any(re.match(r"engine max_num_seqs = 128  \[given\] p: meta.json engine_kwargs.max_num_seqs", x)
               for x in lines), lines
    # no profile: the trace's own default; a trace imported before marks existed: latroute's fallback, marked
    engine, marks = request_engine_marked(None, stated=stated)
    assert engine.num_kv_blocks == t.meta["engine"]["settings"]["num_kv_blocks"]
    engine, marks = request_engine_marked(None)
    assert engine == REQUEST_TRACE_DEFAULTS and "fallback" in marks["num_kv_blocks"].how
