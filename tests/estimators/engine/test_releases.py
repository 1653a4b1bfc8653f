"""The vLLM release an instance names decides the rules the kernel follows."""
from __future__ import annotations

import pytest

from estimators.engine.config import InstanceConfig
from estimators.engine.layout import C_RULES
from estimators.engine.releases import (
    R_FREE_ALL_TO_TAIL,
    R_LONE_PREFILL_CAP,
    in_window,
    nearest_in_window,
    rules_of,
    version_key,
)


def test_versions_are_read_as_vllm_spells_them():
    assert version_key("0.19.1") == (0, 19, 1)
    assert version_key("v0.10.1.1") == (0, 10, 1)
    assert version_key("0.32.0+cpu") == (0, 32, 0)
    assert version_key("0.11.0rc1") == (0, 11, 0)
    assert version_key("0.30") == (0, 30, 0)
    assert version_key("main") is None


@pytest.mark.parametrize(("version", "inside"), [
    ("0.18.9", False), ("0.19.0", True), ("0.23.5", True), ("0.32.0", True), ("0.32.4", True), ("0.33.0", False),
    ("1.0.0", False), ("nightly", False)])
def test_the_window_is_0_19_to_any_0_32(version, inside):
    assert in_window(version) is inside


def test_each_release_takes_the_older_rules_it_predates():
    assert rules_of("0.32.0") == rules_of("0.31.0") == 0
    assert rules_of("0.30.0") == rules_of("0.24.0") == R_LONE_PREFILL_CAP
    assert rules_of("0.23.1") == rules_of("0.19.0") == R_LONE_PREFILL_CAP | R_FREE_ALL_TO_TAIL


def test_an_outside_release_is_replayed_with_the_nearest_end():
    assert nearest_in_window("0.10.1.1") == "0.19.0"
    assert nearest_in_window("0.34.0") == "0.32.0"
    assert nearest_in_window("0.25.1") == "0.25.1"
    with pytest.raises(ValueError):
        nearest_in_window("main")


def test_the_engine_setting_reaches_the_kernel_and_refuses_what_it_does_not_model():
    assert InstanceConfig().vllm_version == "0.32.0" and InstanceConfig().to_array()[C_RULES] == 0
    assert InstanceConfig(vllm_version="0.19.0").to_array()[C_RULES] == R_LONE_PREFILL_CAP | R_FREE_ALL_TO_TAIL
    for bad in ("0.18.0", "0.33.0", "", "latest"):
        with pytest.raises(ValueError, match="vllm_version"):
            InstanceConfig(vllm_version=bad)
    assert InstanceConfig.from_row({"instance_id": "a", "vllm_version": ""}).vllm_version == "0.32.0"
    assert InstanceConfig.from_row({"instance_id": "a", "vllm_version": "0.28.0"}).vllm_version == "0.28.0"
