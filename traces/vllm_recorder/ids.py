"""The client's id inside vLLM's engine request id (stdlib only).

vLLM 0.32's OpenAI server names a completion ``cmpl-<X-Request-Id>`` and
each of its prompts ``cmpl-<X-Request-Id>-<prompt index>``
(``entrypoints/openai/completion/serving.py``, ``_base_request_id``); chat
completions ``chatcmpl-<X-Request-Id>``. ``InputProcessor.assign_request_id``
then appends ``-<8 random characters>`` so engine ids are unique, and
``LLMEngine.add_request(id)`` gives ``<id>-<8 random characters>``.
Stripping those parts gives back what the client sent, the join key.
"""
from __future__ import annotations

import re

_SUFFIX = re.compile(r"-[0-9A-Za-z]{8}$")
_CMPL = re.compile(r"^cmpl-(.*)-\d+$")


def client_id_of(engine_id: str) -> str:
    """The id a client sent, from vLLM's engine request id."""
    base = _SUFFIX.sub("", engine_id)
    m = _CMPL.match(base)
    if m:
        return m.group(1)
    if base.startswith("chatcmpl-"):
        return base[len("chatcmpl-"):]
    return base
