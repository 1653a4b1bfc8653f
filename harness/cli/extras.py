"""The optional extras a command needs, and the one refusal when one is missing.

``pip install -e .`` brings the offline harness only; serving, the live
load generator, Ray sweeps and the learned (LightGBM) estimator come with
extras. A command that needs one asks here at its entry, before it reads or
writes anything, so a missing extra is one line naming the extra and the
install command, exit 2 (bad input: the user asked for something this
install lacks), instead of an internal ``ModuleNotFoundError`` from deep
inside the command. Whether a module is there is asked with
``importlib.util.find_spec``: nothing is imported, so the check costs
nothing where the extra is installed.
"""
from __future__ import annotations

import importlib.util

import click

from harness.cli import EXIT_BAD_INPUT

# extra (as pyproject.toml's [project.optional-dependencies] names it): (modules it must provide, what to call
# it beside the extra's name where that says more, or "")
EXTRAS: dict[str, tuple[tuple[str, ...], str]] = {
    "serve": (("aiohttp", "prometheus_client"), ""),
    "loadgen": (("aiohttp",), ""),
    "ray": (("ray",), "Ray"),
    "learned": (("lightgbm",), "LightGBM"),
}


class MissingExtra(click.ClickException):
    """An optional extra the command needs is not installed: shown as
    ``error: MESSAGE`` by the one error path, exit 2 like any bad input."""

    exit_code = EXIT_BAD_INPUT


def install_command(extra: str) -> str:
    """The command that installs ``extra`` into this clone's environment."""
    return f'python -m pip install -e ".[{extra}]"'


def missing_module(extra: str) -> str | None:
    """The first module of ``extra`` this environment cannot import, or None."""
    for module in EXTRAS[extra][0]:
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):  # a parent package missing, or a module set to None in sys.modules
            spec = None
        if spec is None:
            return module
    return None


def extra_message(command: str, extra: str) -> str:
    """``latroute serve needs the serve extra: python -m pip install -e ".[serve]"``."""
    label = EXTRAS[extra][1]
    return f"latroute {command} needs the {extra} extra{f' ({label})' if label else ''}: {install_command(extra)}"


def require_extra(command: str, extra: str) -> None:
    """Refuse ``latroute COMMAND`` (e.g. ``serve``, ``sweep --backend ray``)
    with MissingExtra when a module of ``extra`` is missing."""
    if missing_module(extra) is not None:
        raise MissingExtra(extra_message(command, extra))
