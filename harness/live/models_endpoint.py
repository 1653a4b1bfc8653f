"""Where a server's answer enters loadgen: ``GET /v1/models``.

Kept apart from the load itself because this is an input like any file:
the answer is size- and depth-checked before it is parsed (a
10,000-deep answer made ``json.loads`` raise RecursionError, an internal
error), refused in one line naming the URL, and every wait on it has a
deadline the caller bounds by ``--time-limit`` (a server that never
answered made loadgen wait forever).
"""
from __future__ import annotations

import asyncio
import json
import re

from harness.live.record import RunFailed
from traces.errors import BadInput

MODELS_MAX_BYTES = 16 << 20  # a larger /v1/models answer is not a model list
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')
_BRACKETS = re.compile(r"[\[\]{}]")
JSON_MAX_DEPTH = 64  # nesting deeper than this is not an OpenAI answer (and would exhaust the parser's stack)


def json_answer(url: str, body: bytes) -> object:
    """An HTTP answer's JSON, or BadInput naming the URL: not UTF-8, not
    JSON, or nested deeper than JSON_MAX_DEPTH (checked before parsing:
    json.loads would raise RecursionError on 10,000 levels)."""
    try:
        text = body.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise BadInput(url, None, "answer", f"not UTF-8 (byte {e.start})") from None
    depth = 0
    for ch in _BRACKETS.findall(_STRINGS.sub("", text)):
        depth += 1 if ch in "[{" else -1
        if depth > JSON_MAX_DEPTH:
            raise BadInput(url, None, "answer", f"JSON nested deeper than {JSON_MAX_DEPTH} levels: not a model list")
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as e:
        raise BadInput(url, None, "answer", f"not JSON ({e})") from None


async def _get_models(session, base_url: str, timeout_s: float) -> tuple[int, bytes]:
    """GET /v1/models within ``timeout_s`` (status, body; the body read up
    to MODELS_MAX_BYTES + 1)."""
    import aiohttp

    async def get() -> tuple[int, bytes]:
        async with session.get(base_url + "/v1/models", timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            return resp.status, await resp.content.read(MODELS_MAX_BYTES + 1)

    return await asyncio.wait_for(get(), timeout=timeout_s)


async def model_name(session, base_url: str, timeout_s: float) -> str:
    import aiohttp

    url = base_url + "/v1/models"
    try:
        status, body = await _get_models(session, base_url, timeout_s)
    except aiohttp.ClientConnectorError as e:
        raise RunFailed(f"server not reachable at {base_url}: {e}") from None
    except TimeoutError:
        raise RunFailed(f"GET {url}: no answer within {timeout_s:g} s (--time-limit, --request-timeout); "
                        "pass --model") from None
    except aiohttp.ClientError as e:
        raise RunFailed(f"GET {url} failed ({type(e).__name__}: {e}); pass --model") from None
    if status != 200:
        raise RunFailed(f"GET {url} answered HTTP {status}; pass --model")
    if len(body) > MODELS_MAX_BYTES:
        raise BadInput(url, None, "answer", f"larger than {MODELS_MAX_BYTES} bytes: not a model list")
    doc = json_answer(url, body)
    try:
        return str(doc["data"][0]["id"])
    except (KeyError, IndexError, TypeError):
        raise RunFailed(f"GET {url}: no model listed; pass --model") from None


async def probe(session, base_url: str, timeout_s: float) -> None:
    import aiohttp

    try:
        await _get_models(session, base_url, timeout_s)
    except aiohttp.ClientConnectorError as e:
        raise RunFailed(f"server not reachable at {base_url}: {e}") from None
    except (TimeoutError, aiohttp.ClientError):
        pass  # reachable; /v1/models is optional when --model is given
