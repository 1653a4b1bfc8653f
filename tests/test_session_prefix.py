"""Sessions of request logs and the prompt prefixes derived from them (``traces.importers.session_prefix``, the
``lmbench`` importer's ``user_id``/``question_id``), and the warning of a prefix-aware router that cannot see
a prefix."""
from __future__ import annotations

import numpy as np
import pytest

from routers import prefix_affinity
from tests.conftest import run_cli
from tests.test_importers import do_import, write
from traces.datamodel.prefix_blocks import ideal_hit_tokens
from traces.errors import BadInput
from traces.importers.session_prefix import SessionColumns, check_turns, conversation_gap, derive_hash_ids
from traces.store import open_trace

HEAD = ("run_id,prompt_tokens,generation_tokens,ttft_s,generation_time_s,user_id,question_id,launch_rel_s,"
        "launch_time_epoch,finish_time_epoch\n")


def _row(prompt, out, user, question, launch, run="r1"):
    return f"{run},{prompt},{out},0.05,0.5,{user},{question},{launch},1,2\n"


def _content_ids(sessions, prompts, outputs, questions, block):
    """The ids the real token content would give: each session's conversation as a token list (a new
    question = fresh tokens after the previous prompt and answer), a block named by its whole prefix."""
    convo: dict[int, list] = {}
    names: dict[tuple, int] = {}
    out = []
    for s, p, o, q in zip(sessions, prompts, outputs, questions):
        c = convo.setdefault(s, [])
        c += [("q", s, len(c), k) for k in range(q)]  # the new question (the whole first prompt on turn 1)
        assert len(c) == p
        out.append([names.setdefault(tuple(c[:(b + 1) * block]), len(names)) for b in range(p // block)])
        c += [("a", s, len(c), k) for k in range(o)]  # the answer, part of the next prompt
    return out


def _same_partition(a, b):
    """Two id lists name the same blocks alike: equal in one exactly where equal in the other."""
    pa = [(i, k, x) for i, row in enumerate(a) for k, x in enumerate(row)]
    pb = [(i, k, x) for i, row in enumerate(b) for k, x in enumerate(row)]
    assert [(i, k) for i, k, _ in pa] == [(i, k) for i, k, _ in pb]
    xa, xb = np.array([x for *_, x in pa]), np.array([x for *_, x in pb])
    return bool((np.equal.outer(xa, xa) == np.equal.outer(xb, xb)).all())


def test_derived_ids_name_blocks_as_the_conversation_content_would():
    """Interleaved sessions with random lengths: turn k's prompt = turn k-1's prompt + answer + question. The
    derived ids share a block exactly where the real content (named by its prefix) would: the previous
    prompt's and answer's full blocks, and nothing across sessions."""
    rng = np.random.default_rng(3)
    for block in (4, 16):
        sessions, prompts, outputs, questions = [], [], [], []
        ctx: dict[int, int] = {}
        for _ in range(60):
            s = int(rng.integers(0, 6))
            q = int(rng.integers(1, 40))
            p = ctx.get(s, 0) + q
            o = int(rng.integers(1, 30))
            sessions.append(s), prompts.append(p), outputs.append(o), questions.append(q)
            ctx[s] = p + o
        got = derive_hash_ids(np.array(sessions), np.array(prompts), np.array(outputs), block)
        assert [len(h) for h in got] == [p // block for p in prompts]
        assert _same_partition(got, _content_ids(sessions, prompts, outputs, questions, block))


def test_lmbench_short_input_shape_shares_the_previous_prompt_and_answer():
    """LMBench's short_input: 76 tokens, 20 out, 29 new each turn (76 -> 125 -> 174). Turn 2's first 6 blocks
    are turn 1's 96 tokens of prompt + answer; its 7th is new."""
    ids = derive_hash_ids(np.array([7, 7, 7]), np.array([76, 125, 174]), np.array([20, 20, 20]), 16)
    assert ids[0] == [0, 1, 2, 3]
    assert ids[1][:6] == [0, 1, 2, 3, 4, 5] and len(ids[1]) == 7 and ids[1][6] not in ids[0]
    assert ids[2][:9] == ids[1] + [ids[2][7], ids[2][8]] and len(ids[2]) == 10
    hit, total = ideal_hit_tokens(ids, [76, 125, 174], 16)
    assert (hit, total) == ((4 + 7) * 16, 375)  # a cache of prompt blocks: the answer's blocks are new to it


def test_a_prompt_shorter_than_the_conversation_so_far_is_found():
    assert conversation_gap(np.array([1, 2, 1]), np.array([50, 10, 60]), np.array([20, 5, 5])) == (2, 60, 70)
    assert conversation_gap(np.array([1, 1]), np.array([50, 70]), np.array([20, 5])) is None


@pytest.mark.parametrize("user, question, row, column, why", [
    ([1, np.nan, 2], [1, 1, 1], 11, "user_id", "some rows only"),
    ([np.nan, np.nan, np.nan], [np.nan, 2, np.nan], 11, "user_id", "without a session"),
    ([1, 1, 2], [1, np.nan, 1], 11, "question_id", "without its turn"),
    ([1, 2, 1], [1, 1, 1], 12, "question_id", "appears twice (row 10"),
    ([1, 1, 2], [2, 1, 1], 11, "question_id", "comes after turn 2 (row 10"),
])
def test_an_inconsistent_session_structure_is_refused_with_its_row(user, question, row, column, why):
    where = SessionColumns("log.csv", np.array([10, 11, 12]), "user_id", "question_id")
    with pytest.raises(BadInput) as e:
        check_turns(np.array(user, dtype=float), np.array(question, dtype=float), where)
    assert (e.value.row, e.value.column) == (row, column) and why in e.value.reason
    assert not check_turns(np.full(3, np.nan), np.full(3, np.nan), where)


def test_lmbench_import_keeps_sessions_and_derives_prefixes(tmp_path):
    # logged in completion order; user 8's turns interleave with user 9's
    src = write(tmp_path, "per_request.csv", HEAD + _row(125, 20, 8, 2, 3.0) + _row(76, 20, 8, 1, 0.0)
                + _row(76, 20, 9, 1, 1.0) + _row(174, 20, 8, 3, 6.0) + _row(125, 20, 9, 2, 4.0))
    res, r = do_import("lmbench", src, tmp_path / "on", "--run", "r1")
    assert res.exit_code == 0, res.output
    assert r["session"].tolist() == [8, 9, 8, 9, 8] and r["turn"].tolist() == [0, 0, 1, 1, 2]
    h = [list(x) for x in r["hash_ids"]]
    assert h[2][:4] == h[0] and h[3][:4] == h[1] and not set(h[1]) & set(h[0])  # no sharing across sessions
    meta = open_trace(tmp_path / "on").meta
    assert meta["hash_block_tokens"] == 16 and meta["sessions"]["prefix"] == "derived"
    assert "2 sessions (user_id)" in res.output and "hash_ids derived" in res.output

    res, r = do_import("lmbench", src, tmp_path / "off", "--run", "r1", "--no-session-prefix")
    assert res.exit_code == 0, res.output
    assert "hash_ids" not in r and r["turn"].tolist() == [0, 0, 1, 1, 2]
    assert "hash_block_tokens" not in open_trace(tmp_path / "off").meta and "not derived" in res.output


def test_turns_that_do_not_carry_the_conversation_get_no_prefixes(tmp_path):
    src = write(tmp_path, "per_request.csv", HEAD + _row(76, 20, 8, 1, 0.0) + _row(80, 20, 8, 2, 3.0))
    res, r = do_import("lmbench", src, tmp_path / "t", "--run", "r1")
    assert res.exit_code == 0, res.output
    assert "hash_ids" not in r and r["session"].tolist() == [8, 8]
    assert "row 3 has a prompt of 80 tokens, shorter than the previous turn's prompt + output (96)" in res.output


@pytest.mark.parametrize("rows, where", [
    (_row(76, 20, 8, 1, 0.0) + _row(76, 20, "", "", 1.0), "per_request.csv:3: user_id: missing on this row"),
    (_row(76, 20, "", 1, 0.0), "per_request.csv:2: user_id: a turn (question_id 1) without a session id"),
    (_row(76, 20, 8, 1, 0.0) + _row(125, 20, 8, 1, 1.0), "per_request.csv:3: question_id: turn 1 of session 8 "
                                                         "appears twice"),
    (_row(125, 20, 8, 2, 0.0) + _row(76, 20, 8, 1, 1.0), "per_request.csv:3: question_id: turn 1 of session 8 "
                                                         "comes after turn 2"),
    (_row(76, 20, 8, 0, 0.0), "per_request.csv:2: question_id: LMBench numbers questions from 1"),
    (_row(76, 20, "u8", 1, 0.0), "per_request.csv:2: user_id: not a number"),
])
def test_lmbench_refuses_a_bad_session_structure(tmp_path, rows, where):
    src = write(tmp_path, "per_request.csv", HEAD + rows)
    res = run_cli("trace", "import", "lmbench", src, "--run", "r1", "--out", tmp_path / "t")
    assert res.exit_code == 2 and not (tmp_path / "t").exists()
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and where in lines[0], res.output


def test_no_session_prefix_is_refused_where_no_format_derives_prefixes(tmp_path):
    src = write(tmp_path, "m.jsonl", '{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}\n')
    res = run_cli("trace", "import", "mooncake", src, "--out", tmp_path / "t", "--no-session-prefix")
    assert res.exit_code == 2 and "--no-session-prefix" in res.output and not (tmp_path / "t").exists()


def _replay(tmp_path, trace, name, router="prefix-affinity"):
    res = run_cli("replay", "--pool", "qwen3-h100-pc", "--trace", trace, "--router", router,
                  "--out", tmp_path / name, "--requests", 60)
    assert res.exit_code == 0, res.output
    return [line for line in res.stderr.splitlines() if line.startswith("warning:")]


def test_a_prefix_aware_router_on_a_trace_without_hash_ids_says_so_once(tmp_path, monkeypatch):
    monkeypatch.setattr(prefix_affinity, "_WARNED", set())
    assert run_cli("trace", "generate", "--sessions", "--requests", 60, "--rate", 4, "--seed", 1,
                   "--out", tmp_path / "chat").exit_code == 0
    assert run_cli("trace", "generate", "--requests", 60, "--rate", 4, "--seed", 1,
                   "--out", tmp_path / "plain").exit_code == 0
    assert _replay(tmp_path, tmp_path / "chat", "a") == []  # the session trace names its blocks: nothing to say
    warned = _replay(tmp_path, tmp_path / "plain", "b")
    assert warned == ["warning: prefix-affinity: the trace has no hash_ids (no request names its prompt blocks); "
                      "it routes exactly as shortest-queue"]
    assert _replay(tmp_path, tmp_path / "plain", "c") == []  # once
    assert _replay(tmp_path, tmp_path / "plain", "d", "shortest-queue") == []  # not a prefix-aware router


def test_large_user_ids_are_kept_exactly(tmp_path):
    big = 2**40 + 1  # above traces.datamodel.limits' time maximum, far below 2**53
    src = write(tmp_path, "per_request.csv", HEAD + _row(76, 20, big, 1, 0.0) + _row(125, 20, big, 2, 2.0))
    res, r = do_import("lmbench", src, tmp_path / "t", "--run", "r1")
    assert res.exit_code == 0, res.output
    assert r["session"].tolist() == [big, big] and [len(h) for h in r["hash_ids"]] == [4, 7]
