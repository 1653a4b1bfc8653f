"""Explicit policies for what a trace lacks (SLOs, quality, predicted
lengths), burstiness end to end, and the result header."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from tests.conftest import assert_refused, run_cli, shared
from traces.policies.quality import one_task_accuracy
from traces.store import TraceWriter, open_trace


@pytest.fixture(scope="module")
def azure(tmp_path_factory):
    """The Azure conversation trace imported: arrivals and lengths only."""
    out = tmp_path_factory.mktemp("az") / "az"
    src = shared("azure_llm_2023", "AzureLLMInferenceTrace_conv.csv")
    assert run_cli("trace", "import", "azure", src, "--out", out).exit_code == 0
    cols = open_trace(out).columns("requests")
    assert "slo_ttft_s" not in cols and "predicted_output_tokens" not in cols and not open_trace(out).has("quality")
    return out


def test_replay_of_an_imported_trace_applies_and_prints_the_default_policies(azure, tmp_path):
    res = run_cli("replay", "--trace", azure, "--requests", 1500, "--router", "sfs-hard", "--out", tmp_path / "r")
    assert res.exit_code == 0, res.output
    for said in ("lengths median", "SLO rule", "quality model"):
        assert said in res.stdout, said
    m = json.loads((tmp_path / "r" / "metrics.json").read_text())
    assert {k: v["policy"] for k, v in m["policies"].items()} == {"lengths": "median", "slo": "rule", "quality": "model"}
    served = pd.read_parquet(tmp_path / "r" / "served" / "requests.parquet")
    slo = served["slo_ttft_s"].to_numpy()
    assert np.isfinite(slo).all() and slo.min() >= 0.150 and slo.max() <= 1.120  # never infinite SLOs
    assert (served["on_time"] == (served["ttft_s"] <= slo)).all()
    assert served["acc"].mean() > 0.3  # never zero accuracy
    assert max(m["share_by_instance"].values()) < 0.9  # not everything to the cheapest model
    q = pd.read_parquet(tmp_path / "r" / "served" / "quality.parquet")  # the accuracies used are kept
    assert len(q) == 3 * 1500 and q.groupby("model")["acc"].mean()["qwen3-32b"] > q.groupby("model")["acc"].mean()["qwen3-0.6b"]
    # asked for explicitly, none is allowed, and said
    res = run_cli("replay", "--trace", azure, "--requests", 500, "--router", "shortest-queue", "--slo", "none",
                  "--out", tmp_path / "r2")
    assert res.exit_code == 0 and "SLO none" in res.stdout
    m2 = json.loads((tmp_path / "r2" / "metrics.json").read_text())
    assert m2["policies"]["slo"]["policy"] == "none" and m2["slo_attainment"] == 1.0


def test_sweep_of_an_imported_trace_applies_and_records_the_default_policies(azure, tmp_path):
    res = run_cli("sweep", "--trace", azure, "--rates", "4,8", "--requests", 800, "--routers",
                  "shortest-queue,sfs-hard", "--workers", 1, "--out", tmp_path / "s")
    assert res.exit_code == 0, res.output
    for said in ("lengths median", "SLO rule", "quality model"):
        assert said in res.stdout, said
    s = json.loads((tmp_path / "s" / "metrics.json").read_text())
    assert {k: v["policy"] for k, v in s["policies"].items()} == {"lengths": "median", "slo": "rule", "quality": "model"}
    df = pd.read_parquet(tmp_path / "s" / "results.parquet")
    assert (df["slo_policy"] == "rule").all() and (df["quality_policy"] == "model").all()
    assert (df["slo_attainment"] < 1).any() and (df["mean_utility"] > 0.3).all()


def test_policies_a_trace_cannot_serve_are_refused(azure, tmp_path):
    for opt, value, said in (("--slo", "column", "slo_ttft_s"), ("--quality", "table", "quality table"),
                             ("--lengths", "column", "predicted_output_tokens")):
        out = tmp_path / f"x{opt}"
        assert_refused(run_cli("replay", "--trace", azure, "--requests", 100, opt, value, "--out", out), out, said)
    assert_refused(run_cli("replay", "--rate", 5, "--requests", 100, "--lengths", "constant:0", "--out",
                           tmp_path / "c0"), tmp_path / "c0", "--lengths")
    assert_refused(run_cli("replay", "--rate", 5, "--router", "sfs-hard", "--delta", 1e-6, "--out", tmp_path / "d"),
                   tmp_path / "d", "--delta", "sfs-soft")  # the registry says sfs-hard has no use for it


def test_a_partial_quality_table_is_refused(tmp_path):
    from traces.workload.generator import WorkloadConfig, generate_workload

    wl = generate_workload(WorkloadConfig(requests=200, seed=2))
    with TraceWriter(tmp_path / "wl") as w:
        w.write_table("requests", wl.requests)
        w.write_table("quality", wl.quality.iloc[:-5])  # the last request lacks some models
    out = tmp_path / "r"
    assert_refused(run_cli("replay", "--trace", tmp_path / "wl", "--out", out), out, "partial", "qwen3")
    assert_refused(run_cli("sweep", "--trace", tmp_path / "wl", "--rates", 4, "--out", out), out, "partial")
    # --quality model replaces it, and says so
    res = run_cli("replay", "--trace", tmp_path / "wl", "--quality", "model", "--router", "latency-agnostic",
                  "--out", out)
    assert res.exit_code == 0 and "quality model" in res.stdout


def test_one_task_accuracy_is_the_mean_over_the_tasks():
    acc = one_task_accuracy()
    assert acc["qwen3-0.6b"] == pytest.approx((0.535 + 0.290 + 0.410 + 0.177) / 4)
    assert acc["qwen3-0.6b"] < acc["qwen3-8b"] < acc["qwen3-32b"]


def test_sweep_burstiness_reaches_the_replayed_arrivals(tmp_path):
    """Gamma with burstiness 0.25 has inter-arrival CV^2 = 4, measured on the
    16,000 arrivals each cell replayed (not on the generator alone)."""
    res = run_cli("sweep", "--arrival", "gamma", "--burstiness", 0.25, "--rates", "6,8", "--requests", 16000,
                  "--routers", "shortest-queue", "--workers", 1, "--out", tmp_path / "s")
    assert res.exit_code == 0, res.output
    df = pd.read_parquet(tmp_path / "s" / "results.parquet")
    assert len(df) == 2 and (df["requests"] == 16000).all()
    assert np.all(np.abs(df["interarrival_cv2"] - 4.0) <= 0.4), df["interarrival_cv2"].tolist()
    s = json.loads((tmp_path / "s" / "metrics.json").read_text())
    assert s["arrival"] == "gamma" and s["burstiness"] == 0.25


def test_burstiness_means_gamma_and_is_refused_where_it_cannot_apply(tmp_path):
    # no --arrival: gamma (vllm bench serve's meaning), on generate and replay
    assert run_cli("trace", "generate", "--requests", 4000, "--rate", 8, "--burstiness", 0.2,
                   "--out", tmp_path / "g").exit_code == 0
    t = open_trace(tmp_path / "g")
    assert t.meta["generator"]["arrivals"]["kind"] == "gamma"
    gaps = np.diff(t.read("requests")["arrival_s"].to_numpy())
    assert gaps.var() / gaps.mean() ** 2 > 3.5  # 1/0.2 = 5, not Poisson's 1
    res = run_cli("replay", "--rate", 8, "--requests", 4000, "--burstiness", 0.2, "--router", "round-robin",
                  "--out", tmp_path / "r")
    assert res.exit_code == 0
    m = json.loads((tmp_path / "r" / "metrics.json").read_text())
    assert m["workload"]["arrival"] == "gamma" and m["workload"]["burstiness"] == 0.2
    served = pd.read_parquet(tmp_path / "r" / "served" / "requests.parquet")
    gaps = np.diff(served["arrival_s"].to_numpy())
    assert gaps.var() / gaps.mean() ** 2 > 3.5
    # a process that cannot honour it: refused, one line
    for cmd in (["trace", "generate", "--requests", 10, "--rate", 8, "--arrival", "mmpp"],
                ["trace", "generate", "--requests", 10, "--rate", 8, "--arrival", "poisson"],
                ["replay", "--rate", 8, "--requests", 10, "--arrival", "mmpp"],
                ["sweep", "--rates", 8, "--requests", 10, "--arrival", "mmpp"]):
        out = tmp_path / "x"
        assert_refused(run_cli(*cmd, "--burstiness", 0.2, "--out", out), out, "--burstiness", "mmpp"
                       if "mmpp" in cmd else "poisson")


def test_the_command_table_documents_every_option_of_replay_and_sweep():
    """The hand-written command table (docs/reference/commands.md; the README
    links it) names every option, vLLM's aliases included (the group adds
    them when it loads a command, so the commands are taken from it)."""
    import click

    from harness.cli import cli
    from tests.conftest import REPO

    table = (REPO / "docs" / "reference" / "commands.md").read_text()
    ctx = click.Context(cli)
    for name in ("replay", "sweep"):
        cmd = cli.get_command(ctx, name)
        missing = [o for p in cmd.params for o in p.opts if o.startswith("--") and o not in table]
        assert not missing, (cmd.name, missing)


def test_replicas_share_their_models_accuracy_under_the_quality_model():
    """``--quality model`` draws one accuracy per model, not per instance: a
    replica pool's table is the one its distinct models give (24 instances,
    3 rows a request), where it was one draw per replica (N x instances rows)."""
    from harness.twin.pools.spec import load_pool
    from traces.policies.quality import quality_table

    reqs = pd.DataFrame({"request_id": np.arange(50, dtype=np.int64)})
    models = [c.model for c in load_pool("qwen3-h100-x8").instances]
    assert len(models) == 24
    got = quality_table(reqs, None, models, "model", seed=3)
    assert len(got.table) == 50 * 3
    pd.testing.assert_frame_equal(got.table, quality_table(reqs, None, list(dict.fromkeys(models)), "model", 3).table)


def test_quality_of_models_the_accuracy_model_does_not_know_is_accuracy_one():
    """A user's own model names: no accuracy is made up for them (the default is ``none``: every accuracy 1,
    so the utility is 1 - lambda * cost and a request on time counts; said so); asking for the accuracy
    model by name is refused naming the model."""
    from traces.policies.quality import quality_table

    reqs = pd.DataFrame({"request_id": np.arange(4)})
    q = quality_table(reqs, None, ["llama-3.1-70b", "llama-3.1-70b"], None, seed=0)
    assert q.policy == "none" and "default" in q.note and "llama-3.1-70b" in q.note
    assert len(q.table) == 4 and (q.table["acc"] == 1).all() and (q.table["acc_hat"] == 1).all()
    with pytest.raises(ValueError, match="not llama-3.1-70b"):
        quality_table(reqs, None, ["llama-3.1-70b"], "model", seed=0)
    known = quality_table(reqs, None, ["qwen3-8b"], None, seed=0)
    assert known.policy == "model" and (known.table["acc"] > 0).any()
