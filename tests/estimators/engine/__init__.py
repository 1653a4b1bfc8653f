"""Tests of estimators/engine/: the scheduler kernel, block pool, engine config, and the peer suite against vLLM."""
