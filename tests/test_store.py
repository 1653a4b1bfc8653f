"""The trace store: schema checks, atomic writes, DuckDB views, refusals."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from tests.conftest import assert_refused, run_cli
from traces.datamodel.schema import TABLES
from traces.errors import BadInput
from traces.store import TraceWriter, open_trace


def requests_frame(n=5):
    return pd.DataFrame({"request_id": np.arange(n), "arrival_s": np.linspace(0, 1, n),
                         "prompt_tokens": np.full(n, 100), "output_tokens": np.full(n, 20)})


def test_roundtrip_types_and_meta(tmp_path):
    df = requests_frame()
    df["ttft_s"] = [0.1, np.nan, 0.3, 0.2, 0.5]
    df["instance_id"] = ["a", None, "b", "a", "b"]
    with TraceWriter(tmp_path / "t") as w:
        w.meta["source"] = {"kind": "test"}
        w.write_table("requests", df)
    t = open_trace(tmp_path / "t")
    assert t.tables == ["requests"]
    assert t.meta["tables"] == {"requests": 5} and t.meta["schema_version"] == 1
    back = t.read("requests")
    assert str(back["prompt_tokens"].dtype) == "int64"
    assert back["ttft_s"].isna().sum() == 1
    schema = t.parquet("requests").schema_arrow
    assert schema.field("request_id").type == "int64" and schema.field("arrival_s").type == "double"
    assert [n for n in schema.names] == ["request_id", "arrival_s", "prompt_tokens", "output_tokens",
                                         "instance_id", "ttft_s"]


@pytest.mark.parametrize("column,value,reason", [
    ("arrival_s", -1.0, "not sorted"),
    ("slo_ttft_s", -0.5, "negative"),
    ("prompt_tokens", np.nan, "NaN"),
    ("output_tokens", -3, "negative"),
    ("arrival_s", np.inf, "infinite"),
])
def test_schema_refusals_name_row_and_column(tmp_path, column, value, reason):
    df = requests_frame()
    df[column] = df[column].astype("float64") if column in df else 0.2
    df.loc[3, column] = value
    with pytest.raises(BadInput) as e:
        with TraceWriter(tmp_path / "t") as w:
            w.write_table("requests", df)
    assert e.value.row == 4 and e.value.column == column and reason in e.value.reason
    assert not (tmp_path / "t").exists()
    assert list(tmp_path.iterdir()) == []


def test_unsorted_and_missing_column(tmp_path):
    df = requests_frame()
    df.loc[2, "arrival_s"] = 0.9
    with pytest.raises(BadInput, match="not sorted") as e:
        with TraceWriter(tmp_path / "t") as w:
            w.write_table("requests", df)
    assert e.value.row == 4
    with pytest.raises(BadInput, match="missing column"):
        with TraceWriter(tmp_path / "t") as w:
            w.write_table("requests", requests_frame().drop(columns="output_tokens"))
    assert list(tmp_path.iterdir()) == []


def test_existing_output_needs_force(tmp_path):
    with TraceWriter(tmp_path / "t") as w:
        w.write_table("requests", requests_frame(3))
    with pytest.raises(BadInput, match="already exists"):
        TraceWriter(tmp_path / "t")
    with TraceWriter(tmp_path / "t", force=True) as w:
        w.write_table("requests", requests_frame(7))
    assert open_trace(tmp_path / "t").meta["tables"]["requests"] == 7
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t"]


def test_views_for_every_table(tmp_path):
    from traces.importers import import_trace
    rec = tmp_path / "rec"
    from tests.test_importers import write_recording
    write_recording(rec)
    import_trace("vllm-record", rec, tmp_path / "t")
    t = open_trace(tmp_path / "t")
    assert set(t.tables) == {"requests", "steps", "step_items", "preemptions", "instances"}
    for name in t.tables:
        res = run_cli("trace", "query", tmp_path / "t", f"select count(*) as n from {name}", "--format", "json")
        assert res.exit_code == 0, res.output
        assert json.loads(res.stdout)[0]["n"] == t.meta["tables"][name]


def test_corrupt_and_truncated_files_are_refused(tmp_path):
    with TraceWriter(tmp_path / "t") as w:
        w.write_table("requests", requests_frame(50))
    path = tmp_path / "t" / "requests.parquet"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    for args in (("trace", "info", tmp_path / "t"), ("trace", "query", tmp_path / "t", "select 1")):
        res = run_cli(*args)
        assert_refused(res, None, "requests.parquet", "not a Parquet file or truncated")
    path.write_text("request_id,arrival_s\n1,2\n")
    assert_refused(run_cli("trace", "info", tmp_path / "t"), None, "requests.parquet", "not a Parquet file")
    path.write_bytes(b"")
    assert_refused(run_cli("trace", "info", tmp_path / "t"), None, "requests.parquet")


def test_not_a_trace_directory(tmp_path):
    assert_refused(run_cli("trace", "info", tmp_path / "nope"), None, "nope", "not a directory")
    (tmp_path / "d").mkdir()
    assert_refused(run_cli("trace", "info", tmp_path / "d"), None, "meta.json", "missing")
    (tmp_path / "d" / "meta.json").write_text("{not json")
    assert_refused(run_cli("trace", "info", tmp_path / "d"), None, "meta.json", "not valid JSON")
    (tmp_path / "d" / "meta.json").write_text('{"schema_version": 99}')
    assert_refused(run_cli("trace", "info", tmp_path / "d"), None, "schema_version")


def test_stored_bad_values_are_refused_on_read(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    with TraceWriter(tmp_path / "t") as w:
        w.write_table("requests", requests_frame(5))
    df = requests_frame(5)
    df.loc[2, "prompt_tokens"] = -7
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False), tmp_path / "t" / "requests.parquet")
    with pytest.raises(BadInput) as e:
        open_trace(tmp_path / "t").read("requests")
    assert e.value.row == 3 and e.value.column == "prompt_tokens"


def test_every_table_schema_has_required_columns():
    for name, schema in TABLES.items():
        assert schema.required, name
        empty = schema.arrow_schema(schema.required).empty_table()
        assert empty.num_rows == 0


def test_atomic_write_never_writes_into_or_replaces_a_pipe(tmp_path):
    """A pipe is refused, neither replaced nor written through (--out /dev/null
    used to be written into or replaced)."""
    import os
    import stat

    from traces.files.outputs import atomic_write_text
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(BadInput, match="named pipe"):
        atomic_write_text(fifo, "hello")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    atomic_write_text(tmp_path / "f.json", "x")
    assert (tmp_path / "f.json").read_text() == "x"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.json", "pipe"]


def test_a_whole_table_is_written_a_row_group_at_a_time_with_the_bytes_of_one_write(tmp_path, monkeypatch):
    """``write_table`` hands the writer one row group's rows at a time (so
    only that much is ever copied to Arrow); the file is byte for byte the
    one a single write of the whole table gives, nulls and strings included."""
    import pyarrow.parquet as pq

    import traces.store as store

    monkeypatch.setattr(store, "ROW_GROUP_ROWS", 1000)
    copied: list[int] = []
    to_arrow = store.to_arrow
    monkeypatch.setattr(store, "to_arrow", lambda df, schema: copied.append(len(df)) or to_arrow(df, schema))
    df = requests_frame(3500)
    df["ttft_s"] = np.where(np.arange(3500) % 7 == 0, np.nan, 0.25)
    df["instance_id"] = np.where(np.arange(3500) < 2100, None, "qwen3-8b-r3").astype(object)  # a chunk of nulls
    with TraceWriter(tmp_path / "chunked") as w:
        w.write_table("requests", df)
    assert copied == [1000, 1000, 1000, 500]
    with TraceWriter(tmp_path / "whole") as w, w.table("requests") as tw:
        tw.write(df)
    a, b = (tmp_path / d / "requests.parquet" for d in ("chunked", "whole"))
    assert pq.ParquetFile(a).metadata.num_row_groups == 4
    assert a.read_bytes() == b.read_bytes()
    pd.testing.assert_frame_equal(open_trace(tmp_path / "chunked").read("requests"),
                                  open_trace(tmp_path / "whole").read("requests"))
