"""Real OpenSSH, Slurm and MUNGE daemons for integration tests.

* :class:`~realhosts.sshd.SshdServer`: sshd on 127.0.0.1 plus an ``ssh_config``
  with host aliases (``cluster``, ``cluster-login``, ``cluster-build``, ``cluster2``).
* :class:`~realhosts.slurm.SlurmCluster`: single-node Slurm 22.05 with a private munged.
* :class:`RealCluster`: both, the sshd passing ``SLURM_CONF`` to remote commands.

The fixtures that use these live in ``tests/conftest.py``.  This directory is
imported as the top-level package ``realhosts`` (pytest puts ``tests/`` on
``sys.path`` because ``tests/`` has no ``__init__.py``).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from .slurm import SlurmCluster
from .sshd import DEFAULT_ALIASES, SshdServer

__all__ = ["DEFAULT_ALIASES", "RealCluster", "SlurmCluster", "SshdServer", "remote_path"]

_SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def remote_path() -> str:
    """PATH for remote sessions: this interpreter's scripts dir, then the system dirs.

    When pytest runs from ``.venv/bin/python`` this puts ``.venv/bin`` (and so
    the project's console scripts) on the remote PATH.
    """
    return f"{os.path.dirname(sys.executable)}:{_SYSTEM_PATH}"


@dataclass
class RealCluster:
    """An sshd whose remote sessions see ``SLURM_CONF`` of a running Slurm cluster."""

    sshd: SshdServer
    slurm: SlurmCluster

    @property
    def ssh_config(self):
        return self.sshd.ssh_config

    def ssh_argv(self, alias: str | None = None, *remote: str) -> list[str]:
        """``ssh -F CONFIG ALIAS [-- REMOTE...]``; see :meth:`SshdServer.ssh_argv`."""
        return self.sshd.ssh_argv(alias, *remote)
