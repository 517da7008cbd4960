"""``pip install`` of the project puts every manual page under ``<prefix>/share/man``,
so ``man vq-admin`` works wherever the install's ``bin`` is on PATH (CONTRACT 11).

A real wheel is built from the tree and installed into a temporary venv
(:mod:`installed_venv`); man-db then finds the pages from PATH alone, with no
MANPATH set.
"""

from __future__ import annotations

import configparser
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from installed_venv import ROOT, clean_env, installed_prefix

MAN_DIR = ROOT / "man"


def _pages() -> list[Path]:
    return sorted(p for p in MAN_DIR.iterdir() if re.search(r"\.[1-9]\Z", p.name))


@pytest.fixture(scope="module")
def prefix(tmp_path_factory) -> Path:
    return installed_prefix(tmp_path_factory.getbasetemp())


def _require_man() -> None:
    if shutil.which("man"):
        return
    reason = "man (Debian package man-db) is not installed; scripts/test.sh installs it"
    if os.environ.get("CI"):
        pytest.fail(f"CI is set and {reason}", pytrace=False)
    pytest.skip(reason)


def test_setup_cfg_installs_every_section_of_man():
    """data_files names each man section present in man/ with a glob, so a new page needs no edit."""
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    data_files = cfg["options.data_files"]
    for section in sorted({p.suffix[1:] for p in _pages()}):
        key = f"share/man/man{section}"
        assert key in data_files, f"setup.cfg [options.data_files] has no {key} for the pages of section {section}"
        assert f"man/*.{section}" in data_files[key].split(), f"{key} does not take man/*.{section}"


def test_every_page_is_installed(prefix):
    for page in _pages():
        installed = prefix / "share" / "man" / f"man{page.suffix[1:]}" / page.name
        assert installed.is_file(), f"{page.name} was not installed under {installed.parent}"
        assert installed.read_bytes() == page.read_bytes(), f"{installed} differs from man/{page.name}"


@pytest.mark.parametrize("args", [["vq-admin"], ["vq-admin-update"], ["5", "vq-admin.toml"], ["vq-admin-agent"],
                                  ["8", "vq-admin-status"]], ids=" ".join)
def test_man_finds_the_page_from_path_alone(prefix, args):
    _require_man()
    env = clean_env(prefix)
    assert "MANPATH" not in env
    done = subprocess.run(["man", "-w", *args], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, f"man -w {' '.join(args)} failed: {done.stderr}"
    found = Path(done.stdout.strip())
    name = args[-1]
    assert found.parent.parent == prefix / "share" / "man", f"man -w found {found}, not the venv's page"
    assert found.name.startswith(name + "."), found


def test_without_the_venv_on_path_man_does_not_find_it(prefix):
    """The control: the page is found through PATH, not because it is installed elsewhere."""
    _require_man()
    env = clean_env(prefix)
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if p != str(prefix / "bin"))
    done = subprocess.run(["man", "-w", "vq-admin-update"], env=env, capture_output=True, text=True, timeout=60,
                          check=False)
    assert str(prefix) not in done.stdout
