"""Replica pools: ``replicas: N`` entries and the built-in
``qwen3-h100-x8/-x32/-x128``."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from harness.cli.listing import list_rows
from harness.twin.pools.spec import load_pool
from traces.errors import BadInput


def _write(tmp_path, instances):
    p = tmp_path / "pool.json"
    p.write_text(json.dumps({"name": "t", "instances": instances}))
    return p


def test_replicas_expand_in_place_with_derived_ids(tmp_path):
    p = _write(tmp_path, [{"instance_id": "small", "model": "qwen3-0.6b", "profile": "qwen3-0.6b-h100", "replicas": 3},
                          {"instance_id": "big", "model": "qwen3-32b", "profile": "qwen3-32b-h100"}])
    pool = load_pool(p)
    assert [c.instance_id for c in pool.instances] == ["small-r0", "small-r1", "small-r2", "big"]
    assert {c.model for c in pool.instances[:3]} == {"qwen3-0.6b"}
    assert pool.instances[0] == replace(pool.instances[2], instance_id="small-r0")


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2", 5000])
def test_bad_replica_count_names_its_row_and_key(tmp_path, bad):
    p = _write(tmp_path, [{"instance_id": "a", "model": "qwen3-8b", "profile": "qwen3-8b-h100"},
                          {"instance_id": "b", "model": "qwen3-8b", "profile": "qwen3-8b-h100", "replicas": bad}])
    with pytest.raises(BadInput) as e:
        load_pool(p)
    assert str(e.value).startswith(f"{p}:2: instances.replicas:")


def test_a_derived_id_that_collides_is_refused_at_the_later_entry(tmp_path):
    p = _write(tmp_path, [{"instance_id": "a", "model": "qwen3-8b", "profile": "qwen3-8b-h100", "replicas": 2},
                          {"instance_id": "a-r1", "model": "qwen3-8b", "profile": "qwen3-8b-h100"}])
    with pytest.raises(BadInput, match=r":2: instance_id: duplicate instance id 'a-r1'"):
        load_pool(p)


@pytest.mark.parametrize(("name", "n"), [("qwen3-h100-x8", 8), ("qwen3-h100-x32", 32), ("qwen3-h100-x128", 128)])
def test_builtin_replica_pools_repeat_the_paper_pool(name, n):
    base, pool = load_pool("qwen3-h100"), load_pool(name)
    assert len(pool.instances) == 3 * n and pool.frontend_overhead_s == base.frontend_overhead_s
    for k, c in enumerate(pool.instances):
        b = base.instances[k // n]
        assert c == replace(b, instance_id=f"{b.instance_id}-r{k % n}")
    rows = dict(list_rows("pools"))
    assert rows[name].startswith(f"{n} x qwen3-0.6b") and f"({3 * n} instances)" in rows[name]


def test_replicas_share_their_configuration_s_calibration():
    """A replica pool is calibrated on its distinct configurations: every
    replica of a model takes the parameters of the paper pool's instance."""
    from harness.twin.pool_baselines import distinct_configs

    pool, stands = distinct_configs(load_pool("qwen3-h100-x8"))
    assert [c.instance_id for c in pool.instances] == ["qwen3-0.6b-r0", "qwen3-8b-r0", "qwen3-32b-r0"]
    assert stands["qwen3-32b-r7"] == "qwen3-32b-r0" and len(stands) == 24
    base = load_pool("qwen3-h100")
    assert distinct_configs(base) == (base, {c.instance_id: c.instance_id for c in base.instances})
    two = replace(base, instances=(base.instances[1], replace(base.instances[1], instance_id="b", host_speed=1.5)))
    assert distinct_configs(two)[0] == two  # configurations that differ are calibrated apart


def test_replay_prints_replica_shares_by_group():
    from harness.cli.replay import format_shares

    shares = {"m-r0": 0.1, "m-r1": 0.3, "solo": 0.2, "x-r7": 0.4}
    assert format_shares(shares) == "m-r0..r1 40.0% (2 replicas, 10.0-30.0% each), solo 20.0%, x-r7 40.0%"
    plain = {"qwen3-0.6b": 0.5, "qwen3-8b": 0.3, "qwen3-32b": 0.2}
    assert format_shares(plain) == "qwen3-0.6b 50.0%, qwen3-8b 30.0%, qwen3-32b 20.0%"
