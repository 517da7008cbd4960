"""Issue 11: default locations in one place (vq_admin/core/default_paths.py): driver, launcher path and agent alike."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from vq_admin import bindings
from vq_admin.launcher import profile_view as readback
from vq_admin.core import default_paths as paths

PACKAGE = Path(paths.__file__).resolve().parent.parent


@pytest.mark.parametrize("xdg", [None, "", "/xdg"])
@pytest.mark.parametrize("override", [None, "", "/explicit"])
def test_every_module_resolves_the_same_defaults(monkeypatch, tmp_path, xdg, override):
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("XDG_STATE_HOME", "XDG_CONFIG_HOME"):
        monkeypatch.delenv(name, raising=False) if xdg is None else monkeypatch.setenv(name, xdg)
    for name in ("VQ_ADMIN_STATE_DIR", "VQ_ADMIN_CONFIG"):
        monkeypatch.delenv(name, raising=False) if override is None else monkeypatch.setenv(name, override)
    state_home = xdg or f"{tmp_path}/.local/state"
    config_home = xdg or f"{tmp_path}/.config"
    expected_state = override or f"{state_home}/vq-admin"
    expected_config = override or f"{config_home}/vq/admin.toml"
    assert paths.state_dir() == bindings.state_root(None) == expected_state
    assert paths.config_path() == readback.config_path_of(None) == expected_config
    assert paths.agent_lock_dir() == f"{state_home}/vq-admin-agent/locks"
    assert bindings.state_root("/given") == "/given" and readback.config_path_of("/given.toml") == "/given.toml"


def test_no_other_module_reads_an_xdg_variable():
    home = Path(paths.__file__).resolve()
    found = [f"{p.relative_to(PACKAGE.parent)}:{node.lineno}" for p in sorted(PACKAGE.rglob("*.py")) if p != home
             for node in ast.walk(ast.parse(p.read_text(), str(p)))
             if isinstance(node, ast.Constant) and node.value in ("XDG_STATE_HOME", "XDG_CONFIG_HOME")]
    assert found == []
