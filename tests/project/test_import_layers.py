"""The layering as a contract (``[tool.importlinter]`` in pyproject.toml).

- ``lint-imports`` passes on the repository;
- each contract can fail: in a temporary copy of the five packages, every
  leak the contracts were written against is put back (an import appended
  to the module that had it) and ``lint-imports`` reports that contract
  broken;
- nothing slips past the linter: no dynamic import (``importlib``,
  ``__import__``) outside the plug-in loaders;
- what the data layer and the engine now each state on their own agrees.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("harness", "traces", "estimators", "routers", "reports")
LINT = shutil.which("lint-imports") or (str(Path(sys.executable).with_name("lint-imports"))
                                        if Path(sys.executable).with_name("lint-imports").exists() else None)
needs_linter = pytest.mark.skipif(LINT is None, reason="import-linter is not installed (pip install -e '.[dev]')")


def lint(root: Path, *contracts: str) -> subprocess.CompletedProcess:
    """``lint-imports`` on the packages under ``root`` with ``root``'s pyproject.toml."""
    args = [LINT, "--no-cache", "--no-logo"] + [a for c in contracts for a in ("--contract", c)]
    env = {**os.environ, "PYTHONPATH": str(root), "COLUMNS": "200"}
    return subprocess.run(args, cwd=root, env=env, capture_output=True, text=True, timeout=120)


@needs_linter
def test_lint_imports_passes():
    r = lint(ROOT)
    assert r.returncode == 0, r.stdout + r.stderr


# (module file, lines appended, contract id, the module the report must name): each leak once found
LEAKS = [
    ("traces/importers/vllm_record.py", ["from estimators.engine import config"], "traces",
     "traces.importers.vllm_record"),
    ("traces/datamodel/schema.py", ["from estimators.engine import config"], "traces", "traces.datamodel.schema"),
    # the step log lived in the engine and wrote traces; it is traces/steplog.py now
    ("estimators/engine/steplog.py", ["from traces.datamodel import schema, step_aggregates",
                                      "from traces import store"], "engine", "estimators.engine.steplog"),
    ("estimators/engine/config.py", ["from traces.datamodel import limits"], "engine", "estimators.engine.config"),
    ("estimators/engine/block_pool.py", ["from traces.datamodel import prefix_blocks"], "engine",
     "estimators.engine.block_pool"),
    ("estimators/engine/timing.py", ["from estimators.timemodel import features, profile"], "engine",
     "estimators.engine.timing"),
    ("routers/oracle.py", ["from harness.twin.loop import kernel"], "routers-twin", "routers.oracle"),
    ("routers/simple.py", ["from estimators.engine.layout import F_COMPUTED"], "routers-engine", "routers.simple"),
    ("reports/series.py", ["from routers import registry"], "reports", "reports.series"),
    ("reports/series.py", ["from estimators.evaluate import accuracy"], "reports", "reports.series"),
    ("reports/series.py", ["from harness.sweep import driver"], "reports", "reports.series"),
    # the rooms: an error metric that imports SFS, a compiled loop that imports the views it feeds
    ("estimators/evaluate/accuracy.py", ["from estimators.sfs import dist"], "estimator-rooms",
     "estimators.evaluate.accuracy"),
    ("harness/twin/loop/skip.py", ["from harness.twin.views import honest"], "twin-rooms", "harness.twin.loop.skip"),
    # the file boundary writes every room's outputs, so it must not reach up into the store it serves
    ("traces/files/outputs.py", ["from traces.store import Trace"], "traces-rooms", "traces.files.outputs"),
]
CYCLE = [("estimators/timemodel/drift.py", ["from estimators.timemodel import online_speed"]),
         ("estimators/timemodel/online_speed.py", ["from estimators.timemodel import drift"])]


@pytest.fixture(scope="module")
def copy(tmp_path_factory) -> Path:
    """The five packages and pyproject.toml, once per module (each case
    restores what it changed)."""
    root = tmp_path_factory.mktemp("layers")
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, root / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    return root


def _with_lines(root: Path, edits: list[tuple[str, list[str]]]):
    """Append the lines to each file (creating it if it is gone); return an undo."""
    saved = {}
    for rel, lines in edits:
        p = root / rel
        saved[p] = p.read_text() if p.exists() else None
        p.write_text((saved[p] or "") + "\n" + "".join(f"{line}  # noqa\n" for line in lines))

    def undo():
        for p, text in saved.items():
            if text is None:
                p.unlink()
            else:
                p.write_text(text)
    return undo


@needs_linter
@pytest.mark.parametrize("rel,lines,contract,module", LEAKS, ids=[f"{c}:{r}:{lines[0].split()[1]}"
                                                                   for r, lines, c, _ in LEAKS])
def test_each_leak_breaks_its_contract(copy, rel, lines, contract, module):
    undo = _with_lines(copy, [(rel, lines)])
    try:
        r = lint(copy, contract)
    finally:
        undo()
    assert r.returncode != 0, f"re-adding {lines} to {rel} did not break contract {contract!r}:\n{r.stdout}"
    assert "BROKEN" in r.stdout and module in r.stdout, r.stdout
    imported = lines[0].split()[1]
    assert imported in r.stdout, r.stdout


@needs_linter
def test_the_drift_online_speed_cycle_breaks_the_acyclic_contract(copy):
    undo = _with_lines(copy, CYCLE)
    try:
        r = lint(copy, "acyclic")
    finally:
        undo()
    assert r.returncode != 0 and "BROKEN" in r.stdout, r.stdout
    assert "online_speed" in r.stdout and "drift" in r.stdout, r.stdout


def test_no_contract_ignores_imports():
    text = (ROOT / "pyproject.toml").read_text()
    section = text[text.index("[tool.importlinter]"):]
    assert "ignore_imports" not in section


# --- every room says what it is and what it may import
# a statement of what the package may import: "May import ...", "imports nothing ...", "imports only ...",
# "import ``traces`` only", "never imports ..."
IMPORT_RULE = re.compile(r"\b(?:may|must|can)\s+(?:not\s+)?import\b|\bimports?\s+(?:nothing|only)\b"
                         r"|\bimports?\s+``[\w.]+``\s+only\b|\bnever\s+imports?\b", re.I)


def _packages() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("__init__.py") if "__pycache__" not in p.parts)


def test_the_import_rule_regex_tells_a_rule_from_a_mention():
    assert IMPORT_RULE.search("May import ``traces`` and ``estimators``.")
    assert IMPORT_RULE.search("it imports nothing of latroute but itself")
    assert not IMPORT_RULE.search("aiohttp is imported lazily by the importers")


@pytest.mark.parametrize("init", _packages(), ids=lambda p: p.parent.relative_to(ROOT).as_posix())
def test_every_package_docstring_states_its_concept_and_its_imports(init):
    """A room's ``__init__`` says what lives there (more than a title) and
    what it may import, so the layering is readable where the code is."""
    import ast

    doc = ast.get_docstring(ast.parse(init.read_text())) or ""
    where = init.relative_to(ROOT).as_posix()
    assert len(doc.split()) >= 15, f"{where}: the docstring does not say what lives in the package"
    assert IMPORT_RULE.search(" ".join(doc.split())), f"{where}: the docstring does not say what it may import"


# --- nothing slips past the linter
PLUGIN_LOADERS = {
    "routers/registry.py": "router plug-ins (--router module:Class)",
    "estimators/estimate.py": "estimator plug-ins (--estimator module:Class)",
    "estimators/plugins.py": "estimator plug-ins built behind their guard, in-process or in an isolated child",
}
# modules that only ask whether a third-party module is installed (importlib.util.find_spec imports nothing)
SPEC_LOOKUPS = {"harness/cli/extras.py": "is an optional extra installed"}
DYNAMIC = re.compile(r"\bimport_module\b|\b__import__\b|^\s*import importlib\s*$|\bimportlib\.(?!metadata\b)\w+"
                     r"|^\s*from importlib import (?!metadata\b)", re.M)


def _dynamic_importers() -> list[str]:
    out = []
    for pkg in PACKAGES:
        for p in sorted((ROOT / pkg).rglob("*.py")):
            if DYNAMIC.search(p.read_text()):
                out.append(p.relative_to(ROOT).as_posix())
    return out


def test_no_dynamic_imports_outside_the_plugin_loaders():
    """A module imported by name at run time is an import the linter cannot
    see; only the plug-in loaders import by name (user code, not latroute's).
    The CLI's lazy command table is checked on its own below."""
    found = [f for f in _dynamic_importers()
             if f not in PLUGIN_LOADERS and f not in SPEC_LOOKUPS and f != "harness/cli/__init__.py"]
    assert found == [], f"dynamic imports outside the plug-in loaders: {found}"
    for f in SPEC_LOOKUPS:  # a lookup, never an import by name
        text = (ROOT / f).read_text()
        assert "find_spec" in text and not re.search(r"\bimport_module\b|\b__import__\b", text), f


def test_the_cli_loads_its_commands_with_imports_the_linter_sees():
    assert "harness/cli/__init__.py" not in _dynamic_importers()


# --- what the data layer and the engine each state on their own agrees
def test_instances_columns_follow_the_engine_config():
    """``traces.datamodel.schema.INSTANCES`` is spelled out in the data layer; it must be
    the table ``InstanceConfig``'s fields describe (one column per field, in
    order, with the field's metadata)."""
    from estimators.engine.config import instance_fields
    from traces.datamodel.limits import MAX_ENGINE
    from traces.datamodel.schema import BOOL, F64, I64, INSTANCES, STR, Column

    kinds = {"int": I64, "float": F64, "str": STR, "bool": BOOL}
    derived = tuple(Column(name, kinds[kind], required=m["required"], nullable=m["nullable"],
                           nonneg=m["nonneg"] and kind in ("int", "float"), doc=m["doc"],
                           maximum=MAX_ENGINE if kind == "int" else None, positive=m.get("positive", False),
                           choices=m.get("choices"), unique=name == "instance_id")
                    for name, kind, m in instance_fields())
    assert INSTANCES.columns == derived


def test_constants_stated_twice_agree():
    import estimators.engine.config as engine_config
    import traces.datamodel.limits
    from estimators.engine.block_ids import OWN_BASE
    from estimators.engine.config import InstanceConfig
    from estimators.timemodel.features import FORMS
    from estimators.timemodel.kernel_form import FORM_IDS
    from traces.datamodel.prefix_blocks import MAX_TRACE_ID
    from traces.importers.vllm_record import DEFAULT_MAX_MODEL_LEN

    assert engine_config.MAX_ENGINE == traces.datamodel.limits.MAX_ENGINE
    assert engine_config.shown(10**60) == traces.datamodel.limits.shown(10**60)
    assert InstanceConfig().max_model_len == DEFAULT_MAX_MODEL_LEN
    assert MAX_TRACE_ID == OWN_BASE - 1
    assert set(FORM_IDS) == set(FORMS)


def test_vllm_record_instances_row_is_the_engine_configs():
    """The importer builds its row without the engine: the same row
    ``InstanceConfig.to_row`` gives for those settings."""
    import math

    import numpy as np

    from estimators.engine.config import InstanceConfig
    from traces.importers.vllm_record import instance_row

    for eng in ({"budget": 512, "max_seqs": 8, "block_size": 16, "num_kv_blocks": 64, "model": "m",
                 "max_model_len": 4096, "long_prefill": 128, "prefix_caching": True, "platform": "cpu (x86)"},
                {"budget": 8, "max_seqs": 4, "block_size": 4, "num_kv_blocks": 9, "model": "m"},
                {"budget": 8, "max_seqs": 4, "block_size": 4, "num_kv_blocks": 9, "model": "m", "vllm_version": "0.19.0"}):
        cfg = InstanceConfig(
            instance_id="m", model="m", gpus=0, policy="vllm-v1", max_num_batched_tokens=eng["budget"],
            max_num_seqs=eng["max_seqs"], block_size=eng["block_size"], num_kv_blocks=eng["num_kv_blocks"],
            price_in=np.nan, price_out=np.nan, long_prefill_token_threshold=int(eng.get("long_prefill", 0) or 0),
            chunked_prefill=True, prefix_caching=bool(eng.get("prefix_caching", False)),
            device="cpu" if "cpu" in str(eng.get("platform", "")).lower() else None,
            **({"max_model_len": int(eng["max_model_len"])} if eng.get("max_model_len") else {}),
            **({"vllm_version": eng["vllm_version"]} if eng.get("vllm_version") else {}))
        want, got = cfg.to_row(), instance_row(eng, "m")
        assert list(got) == list(want)
        for k in want:
            same = (want[k] == got[k] or (isinstance(want[k], float) and math.isnan(want[k]) and math.isnan(got[k])))
            assert same and type(want[k]) is type(got[k]), (k, want[k], got[k])
