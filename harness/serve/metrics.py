"""``/metrics``: vLLM's Prometheus series for one emulated instance.

Names, label keys (``model_name``, ``engine``; ``finished_reason`` on
``vllm:request_success``) and histogram buckets are vLLM's v1
``PrometheusStatLogger``'s, through the same library (prometheus-client),
so a router or dashboard that reads a vLLM server reads this one: every
family served is checked against a real vLLM 0.32 server's ``/metrics``
(tests/data/vllm_0_32_metrics.json; ``_created`` series included, as there). Gauges
are read from the engine at scrape time; counters and histograms are fed
as steps end. Times are the emulated engine's seconds (twin time; with
``--speed K`` they run K times faster than the wall clock).
"""
from __future__ import annotations

import math

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                   480.0, 960.0, 1920.0, 7680.0]
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0]
ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
               80.0]
ITERATION_BUCKETS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")  # vLLM 0.32's, all exposed
_PHASE = "Histogram of time spent in {} phase for request."
TIMINGS = {  # attribute: vLLM's histogram (name, documentation, buckets)
    "iteration": ("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", ITERATION_BUCKETS),
    "ttft": ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS),
    "itl": ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL_BUCKETS),
    "tpot": ("vllm:request_time_per_output_token_seconds", "Histogram of time_per_output_token_seconds per request.",
             ITL_BUCKETS),
    "e2e": ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", LATENCY_BUCKETS),
    "queue": ("vllm:request_queue_time_seconds", _PHASE.format("WAITING"), LATENCY_BUCKETS),
    "inference": ("vllm:request_inference_time_seconds", _PHASE.format("RUNNING"), LATENCY_BUCKETS),
    "prefill": ("vllm:request_prefill_time_seconds", _PHASE.format("PREFILL"), LATENCY_BUCKETS),
    "decode": ("vllm:request_decode_time_seconds", _PHASE.format("DECODE"), LATENCY_BUCKETS),
}
LABELS = ["model_name", "engine"]


def one_two_five(max_value: int) -> list[int]:
    """vLLM's ``build_1_2_5_buckets``: 1, 2, 5, 10, ... up to ``max_value``."""
    out, e = [], 0
    while True:
        for m in (1, 2, 5):
            v = m * 10 ** e
            if v > max_value:
                return out
            out.append(v)
        e += 1


class EngineMetrics:
    """The series of one instance, in a registry of its own (its port's)."""

    def __init__(self, model_name: str, max_model_len: int):
        self.registry = r = CollectorRegistry()
        lab = (model_name, "0")

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, LABELS, registry=r).labels(*lab)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, LABELS, registry=r).labels(*lab)

        def hist(name: str, doc: str, buckets) -> Histogram:
            return Histogram(name, doc, LABELS, buckets=buckets, registry=r).labels(*lab)

        self.running = gauge("vllm:num_requests_running", "Number of requests in model execution batches.")
        self.waiting = gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self.kv = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.pc_queries = counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of "
                                  "queried tokens.")
        self.pc_hits = counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.")
        self.preemptions = counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.")
        success = Counter("vllm:request_success", "Count of successfully processed requests.",
                          LABELS + ["finished_reason"], registry=r)
        self.success = {f: success.labels(*lab, f) for f in FINISH_REASONS}
        lens = one_two_five(max_model_len)
        self.req_prompt = hist("vllm:request_prompt_tokens", "Number of prefill tokens processed.", lens)
        self.req_gen = hist("vllm:request_generation_tokens", "Number of generation tokens processed.", lens)
        self.req_max = hist("vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", lens)
        for attr, (name, doc, buckets) in TIMINGS.items():
            setattr(self, attr, hist(name, doc, buckets))

    def bind(self, engine) -> None:
        """Gauges read the engine when scraped."""
        self.running.set_function(lambda: engine.running)
        self.waiting.set_function(lambda: engine.waiting)
        self.kv.set_function(engine.kv_usage)

    # --- fed by the engine (harness.serve.engine)
    def arrived(self, h) -> None:
        self.req_max.observe(h.max_tokens)

    def token(self, h, t: float) -> None:
        if h.delivered and math.isfinite(h.last_t):
            self.itl.observe(t - h.last_t)
        else:
            self.ttft.observe(t - h.arrival_t)
            self.prompt_tokens.inc(h.prompt)

    def admitted(self, h) -> None:
        """First admission of a request on an instance with prefix caching:
        vLLM 0.32 records the lookup then (``record_prefix_cache_stats``),
        queries = its tokens, hits = its cached tokens; a preempted request's
        re-admission goes to stats this counter does not show, and an
        instance without caching counts nothing."""
        self.pc_queries.inc(h.prompt)
        self.pc_hits.inc(h.cached)

    def step(self, scheduled: int, produced: int) -> None:
        self.iteration.observe(scheduled)
        self.generation_tokens.inc(produced)

    def preempted(self, n: int) -> None:
        if n:
            self.preemptions.inc(n)

    def finished(self, h, engine) -> None:
        self.success[h.finish_reason if h.finish_reason in self.success else "abort"].inc()
        if h.finish_reason == "abort":
            return
        self.e2e.observe(h.finish_t - h.arrival_t)
        if math.isfinite(h.scheduled_t):
            self.queue.observe(h.scheduled_t - h.arrival_t)
            self.inference.observe(h.finish_t - h.scheduled_t)
            self.prefill.observe(h.first_t - h.scheduled_t)
        self.decode.observe(h.finish_t - h.first_t)
        if h.delivered > 1:
            self.tpot.observe((h.finish_t - h.first_t) / (h.delivered - 1))
        self.req_prompt.observe(h.prompt)
        self.req_gen.observe(h.delivered)

    def text(self) -> bytes:
        return generate_latest(self.registry)
