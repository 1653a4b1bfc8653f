"""A pool of the user's own models (no accuracy, or a quality file of
accuracy per model and task) and the user's own SLO (``constant:MS``), in
replay, sweep, estimate and route; and their refusals."""
from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest

from tests.conftest import REPO, assert_refused, run_cli, served_twin_trace, shared
from traces.errors import BadInput

POOL = REPO / "docs" / "pools" / "llama-h100.json"
MODELS = ["llama-3.1-8b", "llama-3.1-70b"]
QUALITY = """# made-up accuracies
model,task,accuracy
llama-3.1-8b,alpaca,0.5
llama-3.1-8b,*,0.25
llama-3.1-70b,*,0.75
"""


@pytest.fixture
def qfile(tmp_path):
    p = tmp_path / "q.csv"
    p.write_text(QUALITY)
    return p


# --- the SLO policy -------------------------------------------------------------------------------------------

def test_constant_slo_is_the_same_target_for_every_request_and_bad_constants_are_refused():
    from traces.policies.slo import check_slo_policy, slo_targets

    reqs = pd.DataFrame({"prompt_tokens": [10, 5000, 30000]})
    t = slo_targets(reqs, "constant:500", seed=3)
    assert t.seconds.tolist() == [0.5, 0.5, 0.5] and t.policy == "constant:500" and "500 ms" in t.note
    assert slo_targets(reqs, "constant:2.5", seed=0).seconds[0] == pytest.approx(0.0025)
    for bad in ("constant:-1", "constant:0", "constant:nan", "constant:inf", "constant:abc", "constant:",
                "constant:MS", "constant:1e10", "fixed:5"):
        with pytest.raises(ValueError):
            check_slo_policy(bad)
    with pytest.raises(ValueError, match="choose from rule, none"):
        check_slo_policy("column", ("rule", "none"))


def test_slo_calls_count_each_estimators_side_of_the_slo():
    """Hand-worked: SLO 1 s; measured 0.5 / 2 / 3 / 0.8, estimates 0.9 / 0.5 / 4 / 1.2."""
    from traces.policies.slo import slo_calls

    est = pd.DataFrame({"request_id": [0, 1, 2, 3], "estimator": "sfs", "true_s": [0.5, 2.0, 3.0, 0.8],
                        "est_s": [0.9, 0.5, 4.0, 1.2]})
    c = slo_calls(est, np.array([3, 2, 1, 0]), np.ones(4))["sfs"]
    assert (c["n"], c["late"]) == (4, 2)
    assert c["right"] == 0.5  # requests 0 and 2
    assert c["late_called_on_time"] == 0.5  # request 1 of the late 1, 2
    assert c["on_time_called_late"] == 0.5  # request 3 of the on-time 0, 3


# --- the quality policy ---------------------------------------------------------------------------------------

def test_quality_file_gives_accuracy_by_task_with_the_star_row_for_the_rest(qfile):
    from traces.policies.quality import quality_table

    reqs = pd.DataFrame({"request_id": [10, 11, 12], "task": ["alpaca", "govreport", None]})
    q = quality_table(reqs, None, MODELS + ["llama-3.1-8b"], str(qfile), seed=0)
    assert q.policy == "file" and str(qfile) in q.note
    t = q.table.set_index(["request_id", "model"])
    assert t.loc[(10, "llama-3.1-8b"), "acc"] == 0.5 and t.loc[(11, "llama-3.1-8b"), "acc"] == 0.25
    assert t.loc[(12, "llama-3.1-8b"), "acc"] == 0.25 and (t.xs("llama-3.1-70b", level="model")["acc"] == 0.75).all()
    assert (q.table["acc"] == q.table["acc_hat"]).all() and len(q.table) == 6  # one row per request and model
    no_task = quality_table(reqs[["request_id"]], None, MODELS, str(qfile), seed=0)
    assert (no_task.table.set_index("model").loc["llama-3.1-8b", "acc"] == 0.25).all()


def test_quality_file_naming_a_model_the_pool_lacks_or_lacking_one_it_has_is_refused(tmp_path, qfile):
    from traces.policies.quality import quality_file, quality_table

    with pytest.raises(BadInput) as e:
        quality_file(str(qfile), ["llama-3.1-8b"])
    assert e.value.row == 5 and "llama-3.1-70b: the pool has no such model" in e.value.reason
    with pytest.raises(BadInput, match="no row for the pool's model llama-3.1-405b"):
        quality_file(str(qfile), MODELS + ["llama-3.1-405b"])
    per_task = tmp_path / "t.csv"
    per_task.write_text("model,task,accuracy\nllama-3.1-8b,alpaca,0.5\nllama-3.1-70b,alpaca,0.7\n")
    reqs = pd.DataFrame({"request_id": [1, 2], "task": ["alpaca", "hotpotqa"]})
    with pytest.raises(ValueError, match="no accuracy for model llama-3.1-8b on task hotpotqa"):
        quality_table(reqs, None, MODELS, str(per_task), seed=0)
    for text, row, col in (("model,task\nm,*\n", 1, "accuracy"), ("model,task,accuracy,x\n", 1, "x"),
                           ("model,task,accuracy\nllama-3.1-8b,*,1.5\n", 2, "accuracy"),
                           ("model,task,accuracy\nllama-3.1-8b,*,nan\n", 2, "accuracy"),
                           ("model,task,accuracy\nllama-3.1-8b,,0.5\n", 2, "task"),
                           ("# c\nmodel,task,accuracy\nllama-3.1-8b,*,0.5\nllama-3.1-8b,*,0.6\n", 4, "task"),
                           ("model,task,accuracy\n", None, "model")):
        bad = tmp_path / "bad.csv"
        bad.write_text(text)
        with pytest.raises(BadInput) as e:
            quality_file(str(bad), ["llama-3.1-8b"])
        assert (e.value.row, e.value.column) == (row, col), (text, e.value)


def test_generated_qwen3_table_is_passed_by_on_a_pool_of_other_models_and_accuracy_is_one():
    from traces.policies.quality import quality_table
    from traces.workload.generator import WorkloadConfig, generate_workload

    wl = generate_workload(WorkloadConfig(requests=50, seed=1))
    q = quality_table(wl.requests, wl.quality, MODELS, None, seed=0)
    assert q.policy == "none" and "accuracy is 1" in q.note and "llama-3.1-8b" in q.note
    assert (q.table["acc"] == 1).all() and (q.table["acc_hat"] == 1).all()
    with pytest.raises(ValueError, match="no accuracy for model llama-3.1-8b"):
        quality_table(wl.requests, wl.quality, MODELS, "table", seed=0)
    assert quality_table(wl.requests, wl.quality, ["qwen3-8b"], None, seed=0).policy == "table"


def test_no_accuracy_makes_meeting_the_slo_count():
    """Accuracy 1: the utility is 1 - lambda * cost > 0 at these prices, so a request on time adds to
    OnTimeUtility and one late adds nothing (with accuracy 0 every utility was negative)."""
    from routers.utility import utility_tables
    from traces.policies.quality import quality_table

    reqs = pd.DataFrame({"request_id": [0, 1], "prompt_tokens": [1000, 100], "output_tokens": [200, 50]})
    q = quality_table(reqs, None, MODELS, None, seed=0)
    u = utility_tables(reqs, q.table, MODELS, np.array([0.1, 0.6]), np.array([0.3, 0.9]), np.array([200, 50]))
    cost = np.array([[1000 * 0.1 + 200 * 0.3, 1000 * 0.6 + 200 * 0.9], [100 * 0.1 + 50 * 0.3, 100 * 0.6 + 50 * 0.9]])
    assert np.allclose(u.realised, 1 - 5e-4 * cost) and (u.realised > 0).all()


# --- the commands ---------------------------------------------------------------------------------------------

def test_replay_of_a_llama_pool_without_and_with_a_quality_file_and_a_constant_slo(tmp_path, qfile):
    res = run_cli("replay", "--pool", POOL, "--rate", 3, "--requests", 300, "--router", "sfs-hard", "--out",
                  tmp_path / "a")
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    note = [ln for ln in lines if ln.startswith("no quality table")]
    assert len(note) == 1 and "accuracy is 1" in note[0]
    head = next(ln for ln in lines if ln.startswith("router sfs-hard:"))
    assert head.startswith("router sfs-hard: SLO attainment") and "SLO goodput" in head
    m = json.loads((tmp_path / "a" / "metrics.json").read_text())
    served = pd.read_parquet(tmp_path / "a" / "served" / "requests.parquet")
    assert m["policies"]["quality"]["policy"] == "none" and (served["acc"] == 1).all()
    assert m["ontime_utility"] == pytest.approx((served["utility"] * served["on_time"]).mean())
    goodput = float(re.search(r"SLO goodput ([0-9.]+) req/s", head).group(1))
    duration = (served["finish_s"].max() - served["arrival_s"].min())
    assert goodput == pytest.approx(served["on_time"].sum() / duration, abs=0.006)

    res = run_cli("replay", "--pool", POOL, "--rate", 3, "--requests", 300, "--router", "shortest-queue",
                  "--quality", qfile, "--slo", "constant:500", "--out", tmp_path / "b")
    assert res.exit_code == 0, res.output
    assert "SLO constant:500: tau = 500 ms" in res.stdout and f"quality file {qfile}" in res.stdout
    assert any(ln.startswith("router shortest-queue: OnTimeUtility") for ln in res.stdout.splitlines())
    m = json.loads((tmp_path / "b" / "metrics.json").read_text())
    assert {k: v["policy"] for k, v in m["policies"].items()} == {
        "lengths": "column", "slo": "constant:500", "quality": "file"}
    served = pd.read_parquet(tmp_path / "b" / "served" / "requests.parquet")
    assert (served["slo_ttft_s"] == 0.5).all() and (served["on_time"] == (served["ttft_s"] <= 0.5)).all()
    small = served["instance_id"] == "llama-3.1-8b"
    want = np.where(small, np.where(served["task"] == "alpaca", 0.5, 0.25), 0.75)
    assert np.allclose(served["acc"], want)


def test_sweep_of_a_llama_pool_leads_with_slo_attainment_and_takes_a_constant_slo(tmp_path, qfile):
    out = tmp_path / "s"
    res = run_cli("sweep", "--pool", POOL, "--rates", "2,4", "--requests", 200, "--routers",
                  "shortest-queue,sfs-hard,sfs-cc", "--slo", "constant:500", "--workers", 1, "--out", out)
    assert res.exit_code == 0, res.output
    assert "no accuracy (quality none): SLO attainment AUC" in res.stdout
    df = pd.read_parquet(out / "results.parquet")
    assert set(df["slo_policy"]) == {"constant:500"} and set(df["quality_policy"]) == {"none"}
    row = next(ln for ln in res.stdout.splitlines() if ln.startswith("sfs-cc ") and "%" in ln)
    att = df[(df["router"] == "sfs-cc") & (df["rate"] == 2)]["slo_attainment"].iloc[0]
    assert f"{100 * att:6.1f}%" in row
    assert run_cli("report", out, "--out", tmp_path / "rep").exit_code == 0
    md = (tmp_path / "rep" / "report.md").read_text()
    table = md[md.index("## Router metrics"):]
    assert "| result | router | SLO attainment (highest rate) | SLO goodput (req/s) | OnTimeUtility" in table
    assert "No quality table (s): every model's accuracy is 1" in table
    res = run_cli("sweep", "--pool", POOL, "--rates", "4", "--requests", 200, "--routers", "sfs-hard",
                  "--quality", qfile, "--workers", 1, "--out", tmp_path / "q")
    assert res.exit_code == 0, res.output
    assert "no accuracy" not in res.stdout and set(pd.read_parquet(tmp_path / "q" / "results.parquet")
                                                   ["quality_policy"]) == {"file"}


def test_estimate_scores_the_estimators_calls_of_a_constant_slo(tmp_path):
    trace = served_twin_trace(tmp_path / "tw")
    res = run_cli("estimate", trace, "--estimators", "sfs", "--slo", "constant:500", "--out", tmp_path / "e")
    assert res.exit_code == 0, res.output
    m = json.loads((tmp_path / "e" / "metrics.json").read_text())
    assert m["slo"]["policy"] == "constant:500" and set(m["slo"]["estimators"]) == {"sfs"}
    est = pd.read_parquet(tmp_path / "e" / "estimates.parquet")
    for name, c in m["slo"]["estimators"].items():
        e = est[(est["estimator"] == name) & np.isfinite(est["est_s"]) & np.isfinite(est["true_s"])]
        assert c["n"] == len(e) and c["late"] == int((e["true_s"] > 0.5).sum())
        assert c["right"] == pytest.approx(((e["true_s"] > 0.5) == (e["est_s"] > 0.5)).mean())
    assert "SLO constant:500" in res.stdout and "  sfs " in res.stdout
    plain = run_cli("estimate", trace, "--estimators", "sfs", "--out", tmp_path / "p")
    assert plain.exit_code == 0 and "slo" not in json.loads((tmp_path / "p" / "metrics.json").read_text())  # not asked: not scored
    assert_refused(run_cli("estimate", trace, "--slo", "constant:0", "--out", tmp_path / "x"), tmp_path / "x",
                   "--slo", "constant:0")


def test_route_book_takes_a_constant_slo_accuracy_one_and_a_quality_files_star_rows(qfile):
    from harness.route.inputs import InputPolicies, RequestBook, stated

    price_in, price_out = np.array([0.1, 0.6]), np.array([0.3, 0.9])
    book = RequestBook(MODELS, price_in, price_out, InputPolicies(slo="constant:500", quality="none"), 4)
    i = book.take(1000, 100, stated({}, {}))
    assert book.inputs.slo[i] == 0.5 and np.allclose(book.acc_hat[i], 1.0)
    assert np.allclose(book.inputs.utility[i], 1.0 - 5e-4 * (1000 * price_in + 100 * price_out))
    j = book.take(10, 5, stated({"x-latroute-slo-ttft-ms": "800"}, {}))  # the request's own header wins
    assert book.inputs.slo[j] == pytest.approx(0.8)
    filed = RequestBook(MODELS, price_in, price_out, InputPolicies(slo="rule", quality=str(qfile)), 2)
    k = filed.take(10, 5, stated({}, {}))
    assert filed.acc_hat[k].tolist() == [0.25, 0.75]  # the * rows: live requests carry no task


def test_route_refuses_a_bad_constant_slo_and_a_quality_file_for_other_models(tmp_path, qfile):
    pytest.importorskip("prometheus_client", reason="latroute route and serve need the serve extra, refused before their options")
    pytest.importorskip("aiohttp")
    args = ("route", "--pool", POOL, "--backends", "http://127.0.0.1:9,http://127.0.0.1:10", "--router",
            "shortest-queue", "--listen", "127.0.0.1:8299")
    for bad in ("constant:-1", "constant:0", "constant:nan", "constant:inf", "constant:x", "column"):
        assert_refused(run_cli(*args, "--slo", bad), None, "--slo")
    other = tmp_path / "o.csv"
    other.write_text("model,task,accuracy\nllama-3.1-8b,*,0.5\nqwen3-8b,*,0.5\n")
    assert_refused(run_cli(*args, "--quality", other), None, "qwen3-8b: the pool has no such model")
    assert_refused(run_cli(*args, "--quality", tmp_path / "none.csv"), None, "--quality", "neither a policy")


@pytest.mark.parametrize("bad", ["constant:-1", "constant:0", "constant:nan", "constant:inf", "constant:abc"])
def test_replay_and_sweep_refuse_a_bad_constant_slo_before_any_work(tmp_path, bad):
    out = tmp_path / "r"
    assert_refused(run_cli("replay", "--pool", POOL, "--rate", 2, "--slo", bad, "--out", out), out, "--slo", bad)
    assert_refused(run_cli("sweep", "--pool", POOL, "--slo", bad, "--out", out), out, "--slo", bad)


def test_replay_and_sweep_refuse_a_quality_file_not_for_the_pool(tmp_path, qfile):
    out = tmp_path / "r"
    extra = tmp_path / "extra.csv"
    extra.write_text(QUALITY + "llama-3.1-405b,*,0.9\n")
    missing = tmp_path / "missing.csv"
    missing.write_text("model,task,accuracy\nllama-3.1-8b,*,0.5\n")
    for cmd in (("replay", "--rate", 2), ("sweep",)):
        assert_refused(run_cli(*cmd, "--pool", POOL, "--quality", extra, "--out", out), out,
                       "extra.csv:6", "llama-3.1-405b: the pool has no such model")
        assert_refused(run_cli(*cmd, "--pool", POOL, "--quality", missing, "--out", out), out,
                       "no row for the pool's model llama-3.1-70b")


def test_the_how_tos_quality_tables_build_and_replay(tmp_path, monkeypatch):
    """docs/how-to/your-models.md's Python blocks run as written (from the evaluation results, and from
    RouterBench's grades in ../shared/data), and replay takes the table they write."""
    data = shared("routing_quality", "routerbench_0shot_subset")
    page = (REPO / "docs" / "how-to" / "your-models.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, re.S)
    assert len(blocks) == 2
    monkeypatch.chdir(tmp_path)
    for code in blocks:
        exec(compile(code.replace("../shared/data/routing_quality/routerbench_0shot_subset", str(data)),
                     "your-models.md", "exec"), {})
    q = pd.read_csv(tmp_path / "quality-llama.csv", comment="#").set_index(["model", "task"])["accuracy"]
    assert q[("llama-3.1-70b", "arc-challenge")] == pytest.approx(0.803, abs=0.001)  # PROVENANCE: test split 0.818
    assert set(pd.read_csv(tmp_path / "quality-eval.csv")["task"]) == {"chat", "summary", "*"}
    res = run_cli("replay", "--pool", POOL, "--rate", 3, "--requests", 200, "--router", "sfs-cc", "--quality",
                  tmp_path / "quality-llama.csv", "--out", tmp_path / "r")
    assert res.exit_code == 0, res.output
    served = pd.read_parquet(tmp_path / "r" / "served" / "requests.parquet")
    star = served["instance_id"].map({m: q[(m, "*")] for m in MODELS})  # generated tasks: the * rows
    assert np.allclose(served["acc"], star)
