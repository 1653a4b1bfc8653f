"""The compiled forest walk gives LightGBM's own predictions, exactly."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("lightgbm")

from estimators.learned.forest import Forest  # noqa: E402
from estimators.learned.model import COMPILE_AFTER, LearnedConfig, TTFTModel  # noqa: E402


def _data(seed: int, n: int = 100):
    rng = np.random.default_rng(seed)
    X = rng.random((n, 8)) * rng.integers(1, 2000, 8)
    X[: n // 4, 2] = 0.0  # counts that are often zero (waiting, prefix score)
    X[:, 5] = np.round(X[:, 5])
    y = np.abs(X @ rng.random(8) * 1e-4 + rng.lognormal(-3, 0.5, n))
    return rng, X, y


@pytest.mark.parametrize("seed", [0, 1])
def test_forest_equals_booster_predict(seed):
    import lightgbm as lgb

    rng, X, y = _data(seed)
    cfg = LearnedConfig(seed=seed)
    for objective, alpha in (("regression", None), ("quantile", 0.5), ("quantile", 0.9)):
        b = lgb.train(cfg.params(objective, alpha), lgb.Dataset(X, y, params={"verbose": -1, "min_data_in_bin": 1}),
                      num_boost_round=cfg.n_estimators)
        f = Forest.from_model_string(b.model_to_string())
        rows = np.vstack([X, rng.random((500, 8)) * rng.integers(1, 3000, 8), np.zeros((2, 8))])
        rows[3, 4] = np.nan  # a missing value goes the way LightGBM sends it
        assert np.array_equal(b.predict(rows, num_threads=1), np.array([f.predict(r) for r in rows]))


def test_a_model_answers_its_boosters_numbers():
    import lightgbm as lgb

    rng, X, y = _data(2)
    cfg = LearnedConfig()
    m = TTFTModel(cfg, X, y)
    rows = rng.random((COMPILE_AFTER + 200, 8)) * 1500
    out = np.array([m.predict(r) for r in rows])
    assert m.forests is not None and m.boosters is None  # booster answers first, then the compiled forests
    # the same fit, made again (deterministic, one thread), answered by LightGBM itself
    raw = np.column_stack([lgb.train(cfg.params(o, a), lgb.Dataset(X, y, params={"verbose": -1, "min_data_in_bin": 1}),
                                     num_boost_round=cfg.n_estimators).predict(rows, num_threads=1)
                           for o, a in (("regression", None), ("quantile", 0.5), ("quantile", 0.9))])
    raw = np.maximum(raw, 0.0)
    raw[:, 2] = np.maximum(raw[:, 2], raw[:, 1])
    assert np.array_equal(out, raw)


def test_single_leaf_trees_and_bad_texts():
    import lightgbm as lgb

    X = np.ones((12, 3))
    b = lgb.train(LearnedConfig().params("regression"), lgb.Dataset(X, np.full(12, 0.25),
                                                                   params={"verbose": -1, "min_data_in_bin": 1}),
                  num_boost_round=5)
    f = Forest.from_model_string(b.model_to_string())
    assert f.predict(np.array([5.0, 0.0, np.nan])) == b.predict(np.array([[5.0, 0.0, np.nan]]))[0]
    with pytest.raises(ValueError, match="no trees"):
        Forest.from_model_string("tree\nversion=v4\n")
    text = b.model_to_string().replace("num_leaves=1", "num_leaves=2", 1)
    with pytest.raises(ValueError, match="num_leaves"):
        Forest.from_model_string(text)
