"""Tests of traces/vllm_recorder/: the recorder's files, record finish and the state feed."""
