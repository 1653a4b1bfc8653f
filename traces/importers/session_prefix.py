"""Sessions of a request log and the prompt prefixes they imply.

A multi-turn client (LMBench's multi-round QA, a chat front end) sends each
turn of a conversation with the conversation so far: turn k's prompt is turn
k-1's prompt, its answer and the new question. Such a log repeats most of
every prompt, and an engine with prefix caching (vLLM V1's default) computes
that part once; but the log holds lengths, not tokens, so neither the
twin's block cache nor a prefix-aware router would see the reuse. This
module checks a log's session and turn columns and derives prompt
``hash_ids`` from the structure, at ``SESSION_BLOCK_TOKENS`` per id.

The derivation (``derive_hash_ids``), per session in arrival order:

- the conversation's content so far is named block by block, prefix-chained
  as ``traces.datamodel.prefix_blocks`` expects (an id stands for its whole prefix);
- turn k's prompt keeps the ids of the previous logged turn's prompt *and
  output* full blocks (turn k-1's prompt + output is the start of turn k's
  prompt), and takes fresh ids for the rest: the block straddling the old
  end and the new question is new content;
- after turn k its output extends the content: the blocks its prompt left
  partial, filled by the answer, get fresh ids that turn k+1 then shares.

What it assumes, and what it does not: the answer re-tokenises to the same
tokens inside the next prompt (the chat template's turn markers sit between
the answer and the new question, so they belong to the new part); no
content is shared across sessions (the log does not say what first turns
have in common: a shared system prompt is not assumed). Only the prompt's
full blocks get ids (``hash_ids`` covers prompts, as everywhere in latroute):
whether the engine still holds the previous turn's blocks, and whether it
cached the output's blocks, is the engine model's business, not the trace's.

A log whose turns do not carry the conversation (some turn's prompt shorter
than the previous turn's prompt + output) gets no ids: the structure would
be invented. The importer says so, naming the row.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from traces.errors import BadInput

SESSION_BLOCK_TOKENS = 16  # vLLM's CUDA block size (its default ``block_size``), the cache's unit of reuse
ASSUMPTION = ("turn k's prompt = turn k-1's prompt + its output + the new question (the conversation so far); "
              "no content shared across sessions")


@dataclass(frozen=True)
class SessionColumns:
    """Where a log's session and turn ids come from, for messages: the file, each row's source line and the
    source's column names."""

    src: Path
    lines: np.ndarray
    session: str
    turn: str

    def refuse(self, i: int, column: str, why: str) -> BadInput:
        return BadInput(self.src, int(self.lines[i]), column, why)


def check_turns(session: np.ndarray, turn: np.ndarray, where: SessionColumns) -> bool:
    """Refuse an inconsistent session structure, naming the first bad row; True when the log has sessions.

    ``session`` and ``turn`` are floats (NaN = the cell is empty), rows in arrival order. A session id on
    some rows only, a turn without a session (or a session's row without a turn), a turn logged twice in
    its session, or a session whose turns go back in arrival order are refused: each breaks the chain
    ``derive_hash_ids`` builds, and a log that numbers its turns wrongly is wrong about more than that."""
    has_s, has_t = np.isfinite(session), np.isfinite(turn)
    if not has_s.any():
        if has_t.any():
            i = int(np.flatnonzero(has_t)[0])
            raise where.refuse(i, where.session, f"a turn ({where.turn} {turn[i]:g}) without a session id")
        return False
    if not has_s.all():
        i = int(np.flatnonzero(~has_s)[0])
        raise where.refuse(i, where.session, f"missing on this row while {int(has_s.sum())} of {has_s.size} rows "
                                             "have one (a session id on some rows only)")
    if not has_t.all():
        i = int(np.flatnonzero(~has_t)[0])
        raise where.refuse(i, where.turn, f"missing: a row of session {session[i]:g} without its turn")
    last: dict[float, tuple[float, int]] = {}
    for i, (s, t) in enumerate(zip(session.tolist(), turn.tolist())):
        prev = last.get(s)
        if prev is not None and t <= prev[0]:
            what = "appears twice" if t == prev[0] else f"comes after turn {prev[0]:g}"
            raise where.refuse(i, where.turn, f"turn {t:g} of session {s:g} {what} (row {int(where.lines[prev[1]])}; "
                                              "turns must rise in launch order)")
        last[s] = (t, i)
    return True


def conversation_gap(session: np.ndarray, prompt: np.ndarray, output: np.ndarray) -> tuple[int, int, int] | None:
    """The first turn (row, its prompt, the previous turn's prompt + output) whose prompt does not hold the
    conversation so far, or None when every turn's does. Rows in arrival order, sessions checked first."""
    ctx: dict[int, int] = {}
    for i, (s, p, o) in enumerate(zip(session.tolist(), prompt.tolist(), output.tolist())):
        before = ctx.get(s)
        if before is not None and p < before:
            return i, int(p), int(before)
        ctx[s] = int(p) + int(o)
    return None


def derive_hash_ids(session: np.ndarray, prompt: np.ndarray, output: np.ndarray,
                    block_tokens: int = SESSION_BLOCK_TOKENS) -> list[list[int]]:
    """Each row's prompt ``hash_ids`` (module doc), rows in arrival order. Ids are numbered from 0 in the
    order they are first needed, so the same log gives the same ids."""
    if block_tokens < 1:
        raise ValueError("block_tokens must be positive")
    chain: dict[int, list[int]] = {}  # session -> ids of the full blocks of its conversation so far
    next_id = 0
    out: list[list[int]] = []
    for s, p, o in zip(session.tolist(), prompt.tolist(), output.tolist()):
        full = int(p) // block_tokens
        kept = chain.get(s, [])[:full]
        ids = kept + list(range(next_id, next_id + full - len(kept)))
        next_id += full - len(kept)
        more = (int(p) + int(o)) // block_tokens - full  # blocks the answer completes or fills
        chain[s] = ids + list(range(next_id, next_id + more))
        next_id += more
        out.append(ids)
    return out

