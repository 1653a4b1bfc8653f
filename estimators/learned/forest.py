"""A trained LightGBM booster as plain arrays, predicted by a compiled walk.

Why: see ``estimators.learned.forest_kernel`` (one-row ``predict`` calls
were the learned routers' whole cost). The arrays come from the booster's
own text model, whose thresholds and leaf values are printed with enough
digits to round-trip a double, so the walk gives ``Booster.predict``'s
numbers (``tests/estimators/learned/test_learned_forest.py`` checks equality on many rows).
Numerical splits only: the learned features are all numbers.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from estimators.learned.forest_kernel import MISSING_NAN, MISSING_NONE, MISSING_ZERO, forest_predict

_FIELDS = ("num_leaves", "split_feature", "threshold", "decision_type", "left_child", "right_child", "leaf_value")
# the text model's missing type (decision_type bits 2-3) is LightGBM's MissingType enum: the kernel's codes
assert (MISSING_NONE, MISSING_ZERO, MISSING_NAN) == (0, 1, 2)


@dataclass(frozen=True)
class Forest:
    """One booster's trees, flattened: node arrays and each tree's root."""

    roots: np.ndarray  # int64 (trees,)
    feature: np.ndarray  # int64 (nodes,): split feature, -1 at a leaf
    threshold: np.ndarray  # float64
    left: np.ndarray  # int64
    right: np.ndarray  # int64
    value: np.ndarray  # float64: leaf output
    default_left: np.ndarray  # uint8
    missing: np.ndarray  # uint8: MISSING_NONE | MISSING_ZERO | MISSING_NAN

    @classmethod
    def from_model_string(cls, text: str) -> Forest:
        """The same walk from the booster's text model (``model_to_string``),
        read field by field for all trees at once (no JSON, no Python per
        node or per tree): ~2x cheaper than walking the JSON dump, which is what
        lets a model be compiled at its first prediction. LightGBM writes
        thresholds and leaf values there with 17 significant digits, so they
        round-trip a double as the JSON dump's do. Nodes are laid out per
        tree as its internal nodes, then its leaves; a child ``c < 0`` is
        leaf ``~c``; ``decision_type`` holds the categorical bit (1),
        default-left (2) and the missing type (bits 2-3)."""
        i = text.find("\nTree=")
        if i < 0:
            raise ValueError("no trees in the model text")
        if "\naverage_output" in text[:i]:
            raise ValueError("a booster that averages its trees (random forest mode) is not walked here")
        body = text[i:text.find("\nend of trees", i) % (len(text) + 1)]
        rows: dict[str, list[str]] = {k: [] for k in _FIELDS}
        for line in body.split("\n"):
            k, _, v = line.partition("=")
            if k in rows:
                rows[k].append(v)

        def field(name: str, dtype) -> np.ndarray:
            return np.array(" ".join(rows[name]).split(), dtype=np.float64).astype(dtype, copy=False)

        leaves = field("num_leaves", np.int64)
        inner = leaves - 1
        n_nodes = inner + leaves
        roots = np.concatenate(([0], np.cumsum(n_nodes)[:-1])).astype(np.int64)
        leaf_value = field("leaf_value", np.float64)
        dt = field("decision_type", np.int64)
        if leaf_value.size != leaves.sum() or dt.size != inner.sum():
            raise ValueError("a tree whose num_leaves does not match its nodes")
        if (dt & 1).any():
            raise ValueError("a categorical split is not walked here")
        # node k of tree t: internal j at roots[t] + j, leaf l at roots[t] + inner[t] + l
        in_pos = np.repeat(roots, inner) + _ranks(inner)
        leaf_pos = np.repeat(roots + inner, leaves) + _ranks(leaves)
        tree_base, tree_inner = np.repeat(roots, inner), np.repeat(inner, inner)

        def child(c: np.ndarray) -> np.ndarray:
            return tree_base + np.where(c >= 0, c, tree_inner + ~c)

        total = int(n_nodes.sum())
        feature = np.full(total, -1, dtype=np.int64)
        threshold, value = np.zeros(total), np.zeros(total)
        left, right = np.full(total, -1, dtype=np.int64), np.full(total, -1, dtype=np.int64)
        default_left, missing = np.zeros(total, dtype=np.uint8), np.full(total, MISSING_NONE, dtype=np.uint8)
        feature[in_pos] = field("split_feature", np.int64)
        threshold[in_pos] = field("threshold", np.float64)
        left[in_pos] = child(field("left_child", np.int64))
        right[in_pos] = child(field("right_child", np.int64))
        default_left[in_pos] = (dt >> 1) & 1
        missing[in_pos] = (dt >> 2) & 3
        value[leaf_pos] = leaf_value
        return cls(roots, feature, threshold, left, right, value, default_left, missing)

    def predict(self, x: np.ndarray) -> float:
        return forest_predict(np.asarray(x, dtype=np.float64), self.roots, self.feature, self.threshold, self.left,
                              self.right, self.value, self.default_left, self.missing)


def _ranks(counts: np.ndarray) -> np.ndarray:
    """0, 1, ..., counts[0]-1, 0, 1, ..., counts[1]-1, ...: each item's place in its group."""
    starts = np.repeat(np.cumsum(counts) - counts, counts)
    return np.arange(int(counts.sum()), dtype=np.int64) - starts
