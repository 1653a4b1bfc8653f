"""The learned TTFT estimator family: what vLLM teams deploy
today for latency-aware routing, llm-d's predicted-latency producer, built
on the same honest instance view every latroute estimator reads.

- ``features``: llm-d's TTFT feature set computed from an instance view
  (KV-cache utilisation, input length, waiting and running counts, prefix
  match score, tokens in flight).
- ``model``: gradient-boosted trees (LightGBM, an optional extra imported
  only when a model is fitted): the mean and the p50/p90 quantiles.
- ``trainer``: online training from first tokens that came back strictly
  before the query's arrival, retrained on a schedule from the newest
  samples.
- ``estimator``: the estimator itself (``learned``), with its cold start:
  the throughput baseline until enough samples have been seen; every
  estimate names which of the two gave it.

May import ``traces``, ``estimators.engine`` (the view), ``estimators.snapshot``
and ``estimators.evaluate``; never SFS, routers or the harness.
"""
