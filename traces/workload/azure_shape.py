"""The Azure conversation trace's arrival shape, rescaled to any mean rate
(``--arrival azure-conv``).

The Azure LLM inference trace 2023 (conversation; Patel et al., Splitwise,
ISCA'24; CC-BY 4.0; ``shared/data/azure_llm_2023``) has 19,366 arrivals in
one hour, 5.4 q/s. A fleet needs hundreds of q/s *over the same hour*:
stretching the trace's time axis (``--arrivals-from``) would squeeze the
hour into a minute and lose its shape. Here the shape is the trace's
arrivals counted per ``BIN_S`` seconds (``shape_counts``, the first 350
whole bins: 3,500 s); a generated run is a Poisson process whose intensity
in each bin is the target mean rate times that bin's count over the mean
count, so the minute-scale swings of the real service (per-10 s counts
vary 4x more than Poisson's) are kept at any rate. Within a bin arrivals
are Poisson: at fleet rates many independent users superpose, and the
trace's own inter-arrival CV^2 (1.2) is close to Poisson's anyway. Why 10 s
bins: at 1 s a bin holds ~5 arrivals and scaling it up would turn the
source's counting noise into rate swings; at 60 s the real 10 s swings
would be smoothed away. Runs longer than 3,500 s repeat the shape.

The counts below are ``shape_counts`` of the trace's ``TIMESTAMP`` column
(``tests/test_fleet_workload.py`` recomputes them from the CSV when the
shared data is present). Only arrival times are taken from it: lengths
come from the generator's task mix (or ``--lengths-from``).
"""
from __future__ import annotations

import numpy as np

BIN_S = 10.0
SHAPE_BINS = 350

AZURE_CONV_COUNTS = (
    13, 18, 28, 30, 58, 44, 51, 44, 46, 39, 39, 46, 52, 43, 62, 58, 59, 55, 70, 46,
    54, 64, 57, 62, 44, 57, 51, 48, 55, 52, 56, 42, 48, 37, 48, 42, 43, 42, 46, 50,
    49, 38, 40, 40, 50, 54, 39, 38, 59, 56, 49, 51, 48, 59, 44, 53, 49, 54, 47, 51,
    48, 44, 43, 55, 49, 62, 56, 41, 48, 54, 49, 54, 62, 48, 61, 53, 51, 70, 49, 52,
    59, 48, 59, 59, 47, 45, 42, 53, 53, 43, 39, 49, 52, 43, 53, 43, 38, 47, 48, 41,
    53, 53, 50, 53, 63, 51, 46, 45, 51, 55, 48, 62, 62, 65, 56, 71, 51, 45, 49, 79,
    55, 39, 66, 61, 70, 60, 54, 42, 63, 68, 62, 54, 65, 76, 62, 63, 63, 79, 57, 82,
    64, 70, 73, 50, 68, 62, 63, 63, 57, 73, 82, 73, 67, 64, 48, 64, 69, 69, 69, 78,
    73, 74, 64, 78, 83, 83, 87, 85, 88, 83, 81, 68, 71, 85, 77, 70, 83, 63, 78, 82,
    60, 83, 75, 69, 88, 73, 85, 98, 88, 75, 86, 75, 65, 85, 81, 73, 72, 62, 88, 74,
    58, 58, 55, 80, 59, 80, 65, 67, 74, 78, 51, 63, 68, 81, 86, 69, 78, 81, 80, 87,
    77, 62, 55, 48, 58, 47, 61, 42, 56, 58, 64, 46, 52, 53, 47, 55, 51, 48, 51, 64,
    47, 66, 59, 39, 59, 63, 60, 65, 61, 51, 58, 60, 62, 63, 65, 46, 38, 45, 67, 64,
    51, 58, 60, 60, 51, 50, 52, 55, 60, 66, 58, 60, 56, 60, 61, 80, 58, 57, 68, 53,
    56, 38, 30, 51, 48, 50, 33, 37, 29, 41, 43, 23, 40, 45, 43, 39, 41, 42, 44, 40,
    44, 57, 31, 49, 41, 43, 46, 47, 39, 45, 65, 38, 45, 36, 53, 47, 37, 38, 47, 40,
    50, 39, 29, 49, 46, 43, 42, 45, 43, 23, 41, 48, 49, 36, 40, 46, 45, 43, 40, 43,
    38, 37, 31, 42, 40, 53, 39, 20, 27, 8,
)


def shape_counts(arrival_s: np.ndarray, bin_s: float = BIN_S, bins: int = SHAPE_BINS) -> np.ndarray:
    """Arrivals per ``bin_s`` seconds from the first arrival, the first ``bins`` whole bins."""
    t = np.asarray(arrival_s, dtype=np.float64)
    t = t - t.min()
    return np.bincount((t // bin_s).astype(np.int64), minlength=bins)[:bins]


def shaped_arrivals(rate: float, rng: np.random.Generator, n: int | None = None, duration: float | None = None,
                    counts=AZURE_CONV_COUNTS, bin_s: float = BIN_S) -> np.ndarray:
    """Sorted arrival times of a Poisson process with mean rate ``rate`` and
    per-bin intensity proportional to ``counts`` (cycled), for ``n``
    arrivals or ``duration`` seconds. Memory is that of the output: bins are
    drawn a block at a time. With a duration the shape is normalised over
    the bins that duration covers (a partial last bin by its share), so the
    expected mean rate is ``rate`` for any duration, cycled or cut short."""
    shape = np.asarray(counts, dtype=np.float64)
    if duration is not None:
        nb = int(np.ceil(duration / bin_s))
        cover = np.minimum(bin_s, duration - np.arange(nb) * bin_s) / bin_s
        shape = shape / (np.sum(shape[np.arange(nb) % shape.size] * cover) / cover.sum())
    else:
        shape = shape / shape.mean()
    per_block = max(1, min(shape.size, int(2_000_000 / max(rate * bin_s, 1.0))))  # ~2M arrivals a block
    out: list[np.ndarray] = []
    got, b0 = 0, 0
    while True:
        b = np.arange(b0, b0 + per_block)
        if duration is not None:
            b = b[b * bin_s < duration]
            if b.size == 0:
                break
        k = rng.poisson(rate * bin_s * shape[b % shape.size])
        times = np.repeat(b * bin_s, k) + rng.random(int(k.sum())) * bin_s
        times.sort()  # bins are in order, so sorting within the block sorts the run
        out.append(times)
        got += times.size
        b0 += per_block
        if n is not None and got >= n:
            break
    times = np.concatenate(out) if out else np.zeros(0)
    return times[:n] if n is not None else times[times < duration]
