"""What a client may send, and what vLLM answers when it may not.

Requests are checked field by field before anything reaches the engine; a
refusal is vLLM's error body (``{"error": {"message", "type", "param",
"code"}}``, status 400, or 404 for an unknown model) naming the field, and
the server goes on serving.

Prompts are token ids, or text through ``../shared/models``' word-level
tokenizer (``w12 w55`` is tokens 12 and 55; any other word is ``<unk>``,
id 0). Chat messages go through a plain template of our own (the tiny
models ship none): each message is ``<s>`` (id 1) followed by its
content's tokens; roles add no tokens. ``cache_salt`` (vLLM's: a
non-empty string) goes into the first prefix block's hash, so requests
with different salts share no cached blocks.

Clients are untrusted: a body larger than ``MAX_REQUEST_BODY`` is refused
with 413 before it is read whole (vLLM's server sets no limit; a prompt of
a pool's longest context is well below a MiB), one nested deeper than
``MAX_JSON_DEPTH`` or holding more than ``MAX_JSON_VALUES`` values is
refused before it is parsed (the parser recurses once per level and runs
without yielding, so its work is bounded before it starts), a
prompt is a string, token ids, or a batch of one of those (no deeper), a
content part is ``{"type": "text", "text": STR}``, and ``X-Request-Id``
(which names the request in the engine, the recording and the decision
log) is at most ``MAX_REQUEST_ID`` visible ASCII characters.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

VOCAB = 8192
_WORD = re.compile(r"w(\d{1,5})")
_WORDS = re.compile(r"\S+")  # str.split()'s words: both split at the same (Unicode) whitespace
MAX_JSON_DEPTH = 64  # pydantic-core, which parses vLLM's requests, refuses JSON nested beyond its own limit too
MAX_REQUEST_ID = 256
_REQUEST_ID = re.compile(rf"[\x21-\x7e]{{1,{MAX_REQUEST_ID}}}")
_STRUCTURE = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{},]')
# a request body: 4 MiB holds half a million tokens of text or ids, over ten times the longest context of the
# pools here; vLLM's uvicorn server reads any size
MAX_REQUEST_BODY = 4 << 20
# JSON values in one body (array items and object members counted by their separators): a prompt of token ids
# is one value per token; json.loads of this many takes tens of ms at most, and holds the interpreter throughout
MAX_JSON_VALUES = 1 << 18


class ApiError(Exception):
    """A request refused with vLLM's error body."""

    def __init__(self, message: str, param: str | None = None, status: int = 400):
        super().__init__(message)
        self.message, self.param, self.status = message, param, status

    def body(self) -> dict:
        kind = {400: "BadRequestError", 404: "NotFoundError", 413: "RequestEntityTooLargeError",
                503: "ServiceUnavailableError"}.get(self.status,
                                                                                                 "InternalServerError")
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.status}}


def error_body(message: str, status: int = 400, param: str | None = None) -> dict:
    return ApiError(message, param, status).body()


def json_shape_ok(data: bytes | str, limit: int = MAX_JSON_DEPTH, values: int = MAX_JSON_VALUES) -> str | None:
    """Why ``data``'s JSON may not be parsed (None: it may): nested more
    than ``limit`` deep, or more than ``values`` separators and openings
    (brackets and commas in strings skipped). A count of the raw bytes
    settles most bodies at C speed; the exact scan below runs in Python,
    which lets other threads run while it does."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes | bytearray) else data
    opens = text.count("[") + text.count("{")
    if opens <= limit and opens + text.count(",") <= values:
        return None
    if '"' not in text and opens + text.count(",") > values:  # no strings: the count is exact
        return f"JSON holding more than {values} values"
    depth = seen = 0
    for m in _STRUCTURE.finditer(text):
        c = m.group()
        if c in "[{":
            depth += 1
            seen += 1
            if depth > limit:
                return f"JSON nested deeper than {limit} levels"
        elif c in "]}":
            depth -= 1
        elif c == ",":
            seen += 1
        if seen > values:
            return f"JSON holding more than {values} values"
    return None


def loads_bounded(data: bytes | str, limit: int = MAX_JSON_DEPTH, values: int | None = None):
    """``json.loads`` of JSON nested at most ``limit`` deep and, with
    ``values``, holding at most that many values (ValueError else)."""
    why = json_shape_ok(data, limit, len(data) + 1 if values is None else values)
    if why is not None:
        raise ValueError(why)
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("JSON nested too deep") from None


def request_id(value: str | None) -> str | None:
    """A client's ``X-Request-Id`` (None: it sent none), or ``ApiError``."""
    if value is None:
        return None
    if not _REQUEST_ID.fullmatch(value):
        what = f"{len(value)} characters" if len(value) > MAX_REQUEST_ID else \
            f"{next((c for c in value if not 0x21 <= ord(c) <= 0x7e), '')!r}" if value else "nothing"
        raise ApiError(f"X-Request-Id: must be 1 to {MAX_REQUEST_ID} visible ASCII characters (no spaces), got "
                       f"{what}", "X-Request-Id")
    return value


def tokenize(text: str) -> list[int]:
    """The word-level tokenizer: ``w<id>`` words are their ids, others <unk>."""
    out = []
    for w in _WORDS.finditer(text):  # as text.split(), but a word at a time: a long text never holds the interpreter
        word = w.group()
        m = _WORD.fullmatch(word)
        out.append(int(m.group(1)) if m and int(m.group(1)) < VOCAB else 0)
    return out


def detokenize(tokens: list[int]) -> str:
    """Output text as vLLM 0.32 decodes the word-level tokenizer's ids: each
    word after a space (``" w7573 w3464"``), the first too."""
    return "".join(f" w{t}" for t in tokens)


@dataclass(frozen=True)
class Parsed:
    prompt_ids: list[int]
    max_tokens: int
    stream: bool
    include_usage: bool
    chat: bool
    cache_salt: str | None = None


def _int(body: dict, key: str, lo: int, hi: int | None = None) -> int | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise ApiError(f"{key}: must be an integer, got {json.dumps(v)[:40]}", key)
    if v < lo or (hi is not None and v > hi):
        bound = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ApiError(f"{key} must be {bound}, got {v}.", key)
    return v


def _bool(body: dict, key: str) -> bool:
    v = body.get(key, False)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise ApiError(f"{key}: must be a boolean, got {json.dumps(v)[:40]}", key)
    return v


def _prompt(v, batch: bool = True) -> list[int]:
    if isinstance(v, str):
        return tokenize(v)
    if batch and isinstance(v, list) and len(v) == 1 and isinstance(v[0], str | list):
        return _prompt(v[0], batch=False)  # a batch of one (a prompt in it is text or token ids, as vLLM's)
    if isinstance(v, list) and v and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        if any(not 0 <= x < VOCAB for x in v):
            raise ApiError(f"prompt: token id out of vocabulary [0, {VOCAB})", "prompt")
        return list(v)
    if isinstance(v, list) and len(v) > 1 and all(isinstance(x, str | list) for x in v):
        raise ApiError("prompt: this server takes one prompt per request", "prompt")
    raise ApiError("prompt: must be a string or a non-empty list of token ids", "prompt")


def _text_part(p, i: int, k: int) -> str:
    """A content part's text: vLLM validates each part against its type."""
    if not isinstance(p, dict):
        raise ApiError(f"messages[{i}].content[{k}]: must be an object", "messages")
    kind = p.get("type", "text")
    if kind != "text":
        raise ApiError(f"messages[{i}].content[{k}]: this server takes text parts only, got type "
                       f"{json.dumps(kind)[:40]}", "messages")
    text = p.get("text")
    if not isinstance(text, str):
        raise ApiError(f"messages[{i}].content[{k}].text: must be a string, got {json.dumps(text)[:40]}",
                       "messages")
    return text


def _messages(v) -> list[int]:
    if not isinstance(v, list) or not v:
        raise ApiError("messages: must be a non-empty list", "messages")
    ids: list[int] = []
    for i, m in enumerate(v):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ApiError(f"messages[{i}]: must be an object with a role", "messages")
        c = m.get("content", "")
        if isinstance(c, list):  # content parts: their text
            c = " ".join(_text_part(p, i, k) for k, p in enumerate(c))
        if c is None:
            c = ""
        if not isinstance(c, str):
            raise ApiError(f"messages[{i}].content: must be a string", "messages")
        ids.append(1)
        ids.extend(tokenize(c))
    return ids


def parse(body: object, chat: bool, served_model: str, max_model_len: int) -> Parsed:
    """A completions (or chat completions) body, checked as vLLM checks it."""
    if not isinstance(body, dict):
        raise ApiError("the request body must be a JSON object")
    model = body.get("model")
    if model is not None and model != served_model:
        raise ApiError(f"The model `{model}` does not exist.", "model", 404)
    if chat:
        if "messages" not in body:
            raise ApiError("messages: field required", "messages")
        ids = _messages(body["messages"])
    else:
        if "prompt" not in body:
            raise ApiError("prompt: field required", "prompt")
        ids = _prompt(body["prompt"])
    if not ids:
        raise ApiError("The prompt cannot be empty.", "prompt")
    n = _int(body, "n", 1, 1)
    del n
    max_key = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _int(body, max_key, 1)
    min_tokens = _int(body, "min_tokens", 0) or 0
    _bool(body, "ignore_eos")
    stream = _bool(body, "stream")
    opts = body.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise ApiError("stream_options: must be an object", "stream_options")
    if opts and not stream:
        raise ApiError("Stream options can only be defined when `stream=True`.", "stream_options")
    include_usage = bool(opts and opts.get("include_usage"))
    salt = body.get("cache_salt")
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise ApiError("Parameter 'cache_salt' must be a non-empty string if provided.", "cache_salt")
    p = len(ids)
    if p >= max_model_len:
        raise ApiError(f"This model's maximum context length is {max_model_len} tokens. However, your request has "
                       f"{p} input tokens. Please reduce the length of the input messages.", "prompt")
    if max_tokens is None:
        max_tokens = max_model_len - p  # vLLM's default: up to the context length
    if p + max_tokens > max_model_len:
        raise ApiError(f"This model's maximum context length is {max_model_len} tokens. However, you requested "
                       f"{p + max_tokens} tokens ({p} in the messages, {max_tokens} in the completion). Please "
                       f"reduce the length of the messages or completion.", max_key)
    if min_tokens > max_tokens:
        raise ApiError(f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {min_tokens}.",
                       "min_tokens")
    return Parsed(ids, max_tokens, stream, include_usage, chat, salt)
