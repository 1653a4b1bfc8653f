"""``vllm_version``, the release whose scheduling rules a trace is replayed with: given when the source or
``--engine`` states it, defaulted to 0.32.0 otherwise, a version outside the checked window (0.19.0 to
0.32.x) refused by name unless accepted as unmodelled (then replayed with the nearest checked release), and
the value reaching the replayed ``InstanceConfig`` with its mark."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from estimators.engine import releases
from estimators.engine.config import InstanceConfig
from estimators.engine.layout import C_RULES
from harness.requestlevel.engine_options import (
    parse_engine_options,
    request_engine_marked,
    trace_caveats,
    trace_engine,
)
from tests.conftest import assert_refused, run_cli
from tests.traces.importers.test_importers import write_recording
from tests.traces.importers.test_reqstats_import import _run
from traces.errors import BadInput, BadOption
from traces.importers.vllm_record import instance_row
from traces.store import open_trace
from traces.vllm_releases import versions

VERSIONS = ("0.19.0", "0.19.1", "v0.19.0", "0.18.9", "0.18", "0.10.1.1", "0.8.5", "0.20", "0.24.0rc1",
            "0.31.9", "0.32.0", "0.32.7+cpu", "v0.32.1", "0.33.0", "0.33", "1.0.0", "1.19.0", "0.100.0",
            "latest", "nightly", "", " 0.25.1 ", "0.x", "v", "dev-0.32.0")


def test_the_data_layer_spells_the_engines_window():
    """``traces.vllm_releases.versions`` imports no engine: its window must be ``estimators.engine.releases``'."""
    assert versions.WINDOW == releases.WINDOW and versions.NEWEST_CHECKED == releases.KERNEL_VERSION
    assert versions.window_text() == releases.window_text() == "0.19.0 to 0.32.x"
    for v in VERSIONS:
        assert versions.version_key(v) == releases.version_key(v), v
        assert versions.in_window(v) == releases.in_window(v), v
        if releases.version_key(v) is not None:
            assert versions.nearest_in_window(v).strip() == releases.nearest_in_window(v).strip(), v
        else:
            assert versions.nearest_in_window(v) == releases.KERNEL_VERSION, v
    assert [v for v in VERSIONS if versions.in_window(v)] == [
        "0.19.0", "0.19.1", "v0.19.0", "0.20", "0.24.0rc1", "0.31.9", "0.32.0", "0.32.7+cpu", "v0.32.1", " 0.25.1 "]
    assert versions.nearest_in_window(None) == "0.32.0" and versions.nearest_in_window("0.8.5") == "0.19.0"


def _import(tmp_path: Path, version: str | None, *extra: str, name: str = "t"):
    meta = {"engine_kwargs": {"max_num_seqs": 8, "max_num_batched_tokens": 512, "tensor_parallel_size": 1}}
    if version is not None:
        meta["vllm_version"] = version
    src = _run(tmp_path, meta=meta, name=f"src-{name}")
    out = tmp_path / name
    return run_cli("trace", "import", "vllm-reqstats", src, "--out", out, "--engine", "num_kv_blocks=640", *extra), out


@pytest.mark.parametrize("version", ["0.18.9", "0.33.0", "nightly"])
def test_a_stated_version_outside_the_window_is_refused_by_its_field(tmp_path, version):
    res, out = _import(tmp_path, version)
    assert_refused(res, out, f"meta.json: vllm_version: {version}: a vLLM release outside the window whose "
                             "scheduling rules latroute checked (0.19.0 to 0.32.x)",
                   "--accept-unmodelled vllm_version")


def test_an_engine_option_outside_the_window_is_refused_by_the_option(tmp_path):
    res, out = _import(tmp_path, "0.19.0", "--engine", "vllm_version=0.33.1")
    assert_refused(res, out, "--engine vllm_version: 0.33.1: a vLLM release outside the window",
                   "--accept-unmodelled vllm_version")


def test_an_accepted_version_is_kept_and_replayed_with_the_nearest_checked_release(tmp_path):
    for version, rules in (("0.10.2", "0.19.0"), ("0.40.1", "0.32.0"), ("nightly", "0.32.0")):
        res, out = _import(tmp_path, version, "--accept-unmodelled", "vllm_version", name=version)
        assert res.exit_code == 0, res.output
        t = open_trace(out)
        eng = t.meta["engine"]
        assert (eng["settings"]["vllm_version"], eng["marks"]["vllm_version"]) == (version, "given")
        assert eng["not_modelled"] == [
            f"vllm_version = {version}: a vLLM release outside the window whose scheduling rules latroute checked "
            f"(0.19.0 to 0.32.x) (replayed with the rules of {rules}, the nearest checked release)"]
        assert trace_caveats([t])["accepted_unmodelled"] == ["vllm_version"]
        cfg, marks = request_engine_marked(None, {}, stated=trace_engine([t]))
        assert cfg.vllm_version == rules and marks["vllm_version"].mark == "given"
        assert f"accepted at import as unmodelled: replayed with {rules}'s rules" in marks["vllm_version"].how
        assert cfg.to_array()[C_RULES] == releases.rules_of(rules)


def test_a_version_in_the_window_reaches_the_kernel_given_and_none_is_032_defaulted(tmp_path):
    res, out = _import(tmp_path, "0.19.0", name="old")
    assert res.exit_code == 0, res.output
    cfg, marks = request_engine_marked(None, {}, stated=trace_engine([open_trace(out)]))
    assert (cfg.vllm_version, marks["vllm_version"].mark) == ("0.19.0", "given")
    assert marks["vllm_version"].how == "old: meta.json vllm_version"
    assert cfg.to_array()[C_RULES] == releases.rules_of("0.19.0") != 0  # 0.19's rules differ from 0.32's
    res, out = _import(tmp_path, "0.32.3", "--engine", "vllm_version=0.24.0", name="given")  # --engine wins
    assert res.exit_code == 0, res.output
    eng = open_trace(out).meta["engine"]
    assert (eng["settings"]["vllm_version"], eng["sources"]["vllm_version"]) == ("0.24.0", "--engine; defaults "
        "below from vLLM 0.24.0 is not tabulated: 0.19.0's defaults, the newest tabulated release before it")
    res, out = _import(tmp_path, None, name="none")
    assert res.exit_code == 0, res.output
    eng = open_trace(out).meta["engine"]
    assert (eng["settings"]["vllm_version"], eng["marks"]["vllm_version"]) == ("0.32.0", "defaulted")
    assert eng["sources"]["vllm_version"] == ("the source states no vLLM version: the scheduling rules are "
                                              "0.32.0's, the newest release latroute checked")
    cfg, marks = request_engine_marked(None, {}, stated=trace_engine([open_trace(out)]))
    assert (cfg.vllm_version, marks["vllm_version"].mark) == ("0.32.0", "defaulted")
    assert cfg.to_array()[C_RULES] == 0


def _fake(tmp_path: Path, settings: dict, marks: dict, accepted=()) -> SimpleNamespace:
    return SimpleNamespace(path=tmp_path / "old", meta={"engine": {
        "settings": settings, "marks": marks, "sources": {k: "then" for k in settings},
        "accepted_unmodelled": list(accepted)}})


def test_traces_imported_before_versions_were_followed(tmp_path):
    """An import that inferred a version from the run's date (or defaulted one) stated none: 0.32.0's rules,
    defaulted, as a re-import says; a stated version outside the window that no import accepted is refused
    naming the meta.json; no marked settings at all: latroute's fallback, 0.32.0, defaulted."""
    for v, kind in (("0.10.1.1", "inferred"), ("0.8.5", "defaulted"), ("0.19.0", "inferred")):
        cfg, marks = request_engine_marked(None, {}, stated=trace_engine([_fake(tmp_path, {"vllm_version": v},
                                                                                {"vllm_version": kind})]))
        assert (cfg.vllm_version, marks["vllm_version"].mark) == ("0.32.0", "defaulted"), v
        assert f"({v} was {kind} before latroute followed a release's rules)" in marks["vllm_version"].how
    with pytest.raises(BadInput) as e:
        trace_engine([_fake(tmp_path, {"vllm_version": "0.10.2"}, {"vllm_version": "given"})])
    assert str(tmp_path / "old" / "meta.json") in str(e.value) and "engine.settings.vllm_version" in str(e.value)
    assert "--accept-unmodelled vllm_version" in str(e.value)
    cfg, marks = request_engine_marked(None, {})
    assert (cfg.vllm_version, marks["vllm_version"].mark) == ("0.32.0", "defaulted")
    assert "the trace names no vLLM version: 0.32.0's scheduling rules" in marks["vllm_version"].how


def test_engine_option_takes_a_version_in_the_window_only(tmp_path):
    assert parse_engine_options(["vllm_version=0.19.0"]) == {"vllm_version": "0.19.0"}
    cfg, marks = request_engine_marked(None, parse_engine_options(["vllm_version=0.19.0"]))
    assert cfg.vllm_version == "0.19.0" and marks["vllm_version"].how == "--engine"
    for bad in ("0.10.2", "0.33.0", "latest"):
        with pytest.raises(BadOption, match=f"vllm_version: '{bad}' is outside"):
            parse_engine_options([f"vllm_version={bad}"])
    for cmd in ("validate", "estimate", "calibrate"):
        out = tmp_path / cmd
        assert_refused(run_cli(cmd, tmp_path, "--engine", "vllm_version=0.33.0", "--out", out), out,
                       f"latroute {cmd}: --engine: vllm_version: '0.33.0' is outside the vLLM releases whose "
                       "scheduling rules latroute checked (0.19.0 to 0.32.x)")


def test_a_recordings_version_is_its_instances_rules(tmp_path):
    """vllm-record: the recording's release reaches the instances row (so the twin replays it with that
    release's rules), the nearest checked one outside the window, said at import."""
    assert [instance_row({"budget": 8, "max_seqs": 4, "block_size": 4, "num_kv_blocks": 9, "model": "m",
                          **({"vllm_version": v} if v is not None else {})}, "m")["vllm_version"]
            for v in ("0.19.0", "0.25.1", "0.10.0", "0.40.0", None, "unknown")] == \
        ["0.19.0", "0.25.1", "0.19.0", "0.32.0", "0.32.0", "0.32.0"]
    for version, rules in (("0.19.0", "0.19.0"), ("0.10.0", "0.19.0")):
        rec = write_recording(tmp_path / f"rec-{version}", engine={
            "budget": 8, "max_seqs": 4, "block_size": 4, "num_kv_blocks": 10, "model": "toy", "long_prefill": 0,
            "max_model_len": 64, "vllm_version": version, "platform": "cpu (test)"})
        res = run_cli("trace", "import", "vllm-record", rec, "--out", tmp_path / version)
        assert res.exit_code == 0, res.output
        t = open_trace(tmp_path / version)
        row = t.read("instances").iloc[0].to_dict()
        assert InstanceConfig.from_row(row).vllm_version == rules
        notes = json.loads((tmp_path / version / "meta.json").read_text())["import_notes"]
        assert notes == ([] if version == rules else [
            "recorded with vLLM 0.10.0, outside the releases whose scheduling rules latroute checked (0.19.0 to "
            "0.32.x): replayed with 0.19.0's rules, so a decision agreement below 100% may be the release's rules, "
            "not a kernel bug"])
    assert versions.unchecked_version_warning({"source": {"kind": "vllm-record", "vllm_version": "0.28.3"}}) is None
    assert "a vLLM of unknown version" in versions.unchecked_version_warning({"source": {"kind": "vllm-record"}})
    assert versions.unchecked_version_warning({"source": {"kind": "vllm-reqstats", "vllm_version": "0.8.5"}}) is None
