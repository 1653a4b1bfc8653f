"""The weight-read floor of a decode step: no step that decodes a token can take less than the time
to read the model's weights from GPU memory once.

Why: a request-level fit sees only end-to-end times, in which a step's constant and its per-token
decode cost trade off against each other (tens of requests decode in every step of a busy run, so
many splits of a step's time fit it). Physics rules some out: every forward pass reads every weight
matrix the tokens go through, so one step decoding one token lasts at least

    (parameters read per step x bytes per parameter) / (tensor-parallel GPUs x peak memory bandwidth)

The parameters read are the model's less its input embedding (a decode reads one row of it); the
bandwidth is the datasheet's peak, which no kernel exceeds, so the floor is a lower bound whatever
the kernels achieve. It is applied only when the trace names the model, its GPU and its tensor
parallelism (``meta.json``: ``source.model`` or ``engine_kwargs.model``; ``source.hardware.
device_name``, an engine ``gpu`` given or inferred, or ``source.gpu``; ``engine_kwargs.
tensor_parallel_size``, or an engine ``tensor_parallel_size`` or ``gpus`` given or inferred), and
the model and GPU are in the tables below; otherwise ``Floor.seconds`` is None and ``Floor.why``
says what was missing. Mixture-of-experts models are not in the table (how many experts a batch
reads depends on the batch).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

# Peak memory bandwidth (bytes/s) by GPU, from the makers' datasheets. Where a name does not tell
# variants apart, the faster one is taken, so the floor stays a lower bound.
GPU_BANDWIDTH: tuple[tuple[str, str, float, str], ...] = (
    # (pattern on the normalised name, GPU, bytes/s, source)
    ("h100.*nvl", "H100 NVL", 3.9e12, "https://www.nvidia.com/en-us/data-center/h100/ (datasheet: H100 NVL 3.9 TB/s)"),
    ("h100.*pcie", "H100 PCIe", 2.0e12, "https://www.nvidia.com/en-us/data-center/h100/ (datasheet: H100 PCIe 2 TB/s)"),
    ("h100", "H100 SXM", 3.35e12, "https://www.nvidia.com/en-us/data-center/h100/ (datasheet: H100 SXM 3.35 TB/s; "
                                  "an H100 named without NVL or PCIe, e.g. 80GB HBM3, is the SXM)"),
    ("h200", "H200", 4.8e12, "https://www.nvidia.com/en-us/data-center/h200/ (datasheet: 4.8 TB/s)"),
    ("a100.*40", "A100 40GB", 1.555e12, "https://www.nvidia.com/en-us/data-center/a100/ (datasheet: A100 40GB 1,555 GB/s)"),
    ("a100", "A100 80GB SXM", 2.039e12, "https://www.nvidia.com/en-us/data-center/a100/ (datasheet: A100 80GB SXM "
                                        "2,039 GB/s, the faster of the 80GB variants)"),
    ("l40s", "L40S", 864e9, "https://www.nvidia.com/en-us/data-center/l40s/ (datasheet: 864 GB/s)"),
    ("l4(?!0)", "L4", 300e9, "https://www.nvidia.com/en-us/data-center/l4/ (datasheet: 300 GB/s)"),
    ("rtxpro6000", "RTX PRO 6000 Blackwell", 1.792e12,
     "https://www.nvidia.com/en-us/products/workstations/professional-desktop-gpus/rtx-pro-6000/ (1,792 GB/s)"),
    ("rtx4090", "GeForce RTX 4090", 1.008e12,
     "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf (RTX 4090: 1,008 GB/s)"),
)

# Parameters a decode step reads: all of the model's less its input embedding (vocab x hidden, one row read per
# token). From each model's Hugging Face card and config.json (total parameters; vocab_size, hidden_size).
MODEL_PARAMS: dict[str, tuple[float, str]] = {
    "llama-3.1-8b": (8.030e9 - 128_256 * 4096, "https://huggingface.co/meta-llama/Llama-3.1-8B (8.03B parameters; "
                                               "vocab 128,256 x hidden 4,096)"),
    "llama-3.1-70b": (70.554e9 - 128_256 * 8192, "https://huggingface.co/meta-llama/Llama-3.1-70B (70.6B parameters; "
                                                 "vocab 128,256 x hidden 8,192)"),
    "llama-3.3-70b": (70.554e9 - 128_256 * 8192, "https://huggingface.co/meta-llama/Llama-3.3-70B-Instruct (70.6B "
                                                 "parameters; vocab 128,256 x hidden 8,192)"),
    "qwen3-8b": (8.19e9 - 151_936 * 4096, "https://huggingface.co/Qwen/Qwen3-8B (8.2B parameters; vocab 151,936 x "
                                          "hidden 4,096)"),
    "qwen3-32b": (32.8e9 - 151_936 * 5120, "https://huggingface.co/Qwen/Qwen3-32B (32.8B parameters; vocab 151,936 x "
                                           "hidden 5,120)"),
}
# What one token of KV cache is, per model: (layers, KV heads, head dimension), from each model's config.json
# (num_hidden_layers, num_key_value_heads, head_dim or hidden_size / num_attention_heads).
KV_GEOMETRY: dict[str, tuple[tuple[int, int, int], str]] = {
    "llama-3.1-8b": ((32, 8, 128), "https://huggingface.co/meta-llama/Llama-3.1-8B/blob/main/config.json (32 "
                                   "layers, 8 KV heads, 4,096 / 32 heads = 128)"),
    "llama-3.1-70b": ((80, 8, 128), "https://huggingface.co/meta-llama/Llama-3.1-70B/blob/main/config.json (80 "
                                    "layers, 8 KV heads, 8,192 / 64 heads = 128)"),
    "llama-3.3-70b": ((80, 8, 128), "https://huggingface.co/meta-llama/Llama-3.3-70B-Instruct/blob/main/"
                                    "config.json (80 layers, 8 KV heads, 8,192 / 64 heads = 128)"),
    "qwen3-8b": ((36, 8, 128), "https://huggingface.co/Qwen/Qwen3-8B/blob/main/config.json (36 layers, 8 KV "
                               "heads, head_dim 128)"),
    "qwen3-32b": ((64, 8, 128), "https://huggingface.co/Qwen/Qwen3-32B/blob/main/config.json (64 layers, 8 KV "
                                "heads, head_dim 128)"),
}
DTYPE_BYTES = {"bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2, "float32": 4, "fp8": 1}
NATIVE_DTYPE = "bfloat16"  # every model in MODEL_PARAMS ships its weights in bf16 (config.json torch_dtype)


@dataclass(frozen=True)
class Floor:
    seconds: float | None  # the floor of a one-token decode step; None: not applied
    why: str  # how it was computed, or what was missing
    sources: tuple[str, ...] = ()  # where the model's size and the GPU's bandwidth come from

    def to_json(self) -> dict:
        return {"seconds": self.seconds, "why": self.why, "sources": list(self.sources)}


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9.]", "", str(name).lower())


def gpu_bandwidth(name: str) -> tuple[str, float, str] | None:
    n = _norm(name).replace(".", "")
    for pattern, gpu, bw, src in GPU_BANDWIDTH:
        if re.search(pattern, n):
            return gpu, bw, src
    return None


def model_params(name: str, table: str = "MODEL_PARAMS"):
    """``(key, value, source)`` of the model ``name`` in the table named (``MODEL_PARAMS``: parameters
    read per step; ``KV_GEOMETRY``: layers, KV heads, head dimension), or None."""
    n = _norm(name.split("/")[-1])
    for key, (value, src) in {"MODEL_PARAMS": MODEL_PARAMS, "KV_GEOMETRY": KV_GEOMETRY}[table].items():
        k = _norm(key)
        if n == k or n.startswith(k) and not n[len(k):len(k) + 1].isdigit():
            return key, value, src
    return None


def _stated(engine: dict, key: str):
    """An engine setting of the trace's meta that the source gave or that was inferred from the run (a
    defaulted one says nothing about this run)."""
    settings, marks, sources = (engine.get(k) or {} for k in ("settings", "marks", "sources"))
    if key not in settings or settings[key] in (None, "", "unknown"):
        return None
    if marks.get(key) == "defaulted" or (not marks and "default" in str(sources.get(key, "default"))):
        return None
    return settings[key]


@dataclass(frozen=True)
class _Deployment:
    model: str
    gpu: tuple[str, float, str]  # gpu_bandwidth's answer
    tp: int
    kwargs: dict


def _deployment(meta: dict, table: str) -> _Deployment | Floor:
    """The model, GPU and tensor parallelism a trace's ``meta.json`` names, or the Floor that says
    which is missing (``table``: the model table the caller needs the model in)."""
    src = meta.get("source") or {}
    src = src if isinstance(src, dict) else {}
    kwargs = src.get("engine_kwargs") or {}
    kwargs = kwargs if isinstance(kwargs, dict) else {}
    model = src.get("model") or kwargs.get("model")
    hw = src.get("hardware") or {}
    engine = meta.get("engine") or {}
    engine = engine if isinstance(engine, dict) else {}
    gpu = (hw.get("device_name") if isinstance(hw, dict) else None) or _stated(engine, "gpu") or src.get("gpu")
    tp = kwargs.get("tensor_parallel_size") or _stated(engine, "tensor_parallel_size") or _stated(engine, "gpus")
    missing = [what for what, v in (("model", model), ("GPU", gpu), ("tensor parallelism", tp)) if not v]
    if missing:
        return Floor(None, f"not applied: the trace does not name its {' or '.join(missing)}")
    g = gpu_bandwidth(str(gpu))
    if g is None:
        return Floor(None, f"not applied: GPU {gpu!r} is not in the bandwidth table (weight_floor.GPU_BANDWIDTH)")
    if model_params(str(model), table) is None:
        return Floor(None, f"not applied: model {model} is not in the table (weight_floor.{table})")
    return _Deployment(str(model), g, int(tp), kwargs)


def weight_floor(meta: dict) -> Floor:
    """The floor for a trace's ``meta.json`` (see the module docstring)."""
    d = _deployment(meta, "MODEL_PARAMS")
    if isinstance(d, Floor):
        return d
    m, g, tp, kwargs, model = model_params(d.model), d.gpu, d.tp, d.kwargs, d.model
    dtype = str(kwargs.get("dtype") or "auto").lower()
    if "fp8" in _norm(str(model)) or "fp8" in str(kwargs.get("quantization") or "").lower():
        dtype = "fp8"
    said = dtype in DTYPE_BYTES
    nbytes = DTYPE_BYTES[dtype if said else NATIVE_DTYPE]
    secs = m[1] * nbytes / (int(tp) * g[1])
    return Floor(secs, f"{m[0]}: {m[1] / 1e9:.2f}B parameters read per step x {nbytes} bytes "
                       f"({dtype if said else NATIVE_DTYPE + ', as shipped; dtype ' + dtype}) / "
                       f"({int(tp)} x {g[0]} at {g[1] / 1e9:,.0f} GB/s) = {1e3 * secs:.2f} ms", (m[2], g[2]))


def kv_read_floor(meta: dict) -> Floor:
    """The floor of ``sum_ctx``, seconds per cached context token per step: a step reads the KV cache of
    every token its requests attend to (keys and values, every layer, every KV head), which no kernel
    does faster than the GPUs' memory bandwidth. Same conditions as ``weight_floor`` (model, GPU and
    tensor parallelism named; model in ``KV_GEOMETRY``). The KV cache's dtype is the engine's
    ``kv_cache_dtype`` where the trace gives it (fp8: 1 byte), else the model's (vLLM's ``auto``)."""
    d = _deployment(meta, "KV_GEOMETRY")
    if isinstance(d, Floor):
        return d
    key, (layers, heads, dim), src = model_params(d.model, "KV_GEOMETRY")
    kv = str(d.kwargs.get("kv_cache_dtype") or "auto").lower()
    nbytes = 1 if "fp8" in kv else DTYPE_BYTES.get(str(d.kwargs.get("dtype") or "").lower(),
                                                   DTYPE_BYTES[NATIVE_DTYPE])
    per_token = 2 * layers * heads * dim * nbytes
    secs = per_token / (d.tp * d.gpu[1])
    return Floor(secs, f"{key}: 2 x {layers} layers x {heads} KV heads x {dim} x {nbytes} bytes = "
                       f"{per_token / 1024:,.0f} KiB per context token / ({d.tp} x {d.gpu[0]} at "
                       f"{d.gpu[1] / 1e9:,.0f} GB/s) = {1e9 * secs:.1f} ns", (src, d.gpu[2]))
