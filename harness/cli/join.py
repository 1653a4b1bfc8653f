"""``latroute trace join``: one run seen from both sides (client and engine)."""
from __future__ import annotations

from pathlib import Path

import click

from harness.cli.params import refuse_non_utf8


@click.command("join")
@click.argument("client_dir", metavar="CLIENT", type=click.Path(path_type=Path))
@click.argument("recording", metavar="RECORDING_DIR", type=click.Path(path_type=Path))
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Directory for join.parquet, join.json.")
@click.option("--force", is_flag=True, help="Replace --out if it exists.")
def join(client_dir: Path, recording: Path, out: Path, force: bool) -> None:
    """Join a `latroute loadgen` trace with the server's recording of the same run.

    The key is the X-Request-Id loadgen sent, which the recording scheduler,
    or `latroute serve --record`, logs (never the order): every successful client request must be in the
    recording. Reports client TTFT - engine TTFT (the API server's overhead:
    HTTP, hand-over, detokenisation) per request and its median and p90.
    `latroute validate REC --join OUT` compares the twin with client TTFTs.

    \b
    Example:
      latroute trace join client-run rec-run --out join-run
    """
    refuse_non_utf8({"CLIENT": client_dir, "RECORDING_DIR": recording, "--out": out})
    from traces.files.outputs import StagedDir, check_out, write_json, write_parquet  # pyarrow: only when joining

    check_out(out, force, inputs=[client_dir, recording])  # before any work
    from traces.client_join import join_client_recording
    from traces.store import open_trace

    res = join_client_recording(open_trace(client_dir), recording)
    with StagedDir(out, force) as tmp:
        write_parquet(tmp / "join.parquet", res.per_request)
        write_json(tmp / "join.json", res.summary)
    s, o = res.summary, res.summary["ttft_overhead"]
    click.echo(f"joined {s['joined']} of {s['client_requests']} client requests ({s['client_failed']} failed on the "
               f"client; {s['recorded_not_from_client']} recorded requests not from this client)")
    if o["n"]:
        speed = s.get("server_speed", 1)
        clock = f"; server seconds, --speed {speed:g}" if speed != 1 else ""
        click.echo(f"client TTFT - engine TTFT: median {o['median_ms']:.2f} ms, p90 {o['p90_ms']:.2f} ms, "
                   f"mean {o['mean_ms']:.2f} ms over {o['n']} requests "
                   f"(TTFT median {s['client_ttft_median_ms']:.1f} ms client, {s['engine_ttft_median_ms']:.1f} ms engine"
                   f"{clock})")
    click.echo(f"wrote {out}")
