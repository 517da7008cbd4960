"""Default locations, computed in one place (XDG base directories).

* the driver's state directory: ``$VQ_ADMIN_STATE_DIR``, else
  ``${XDG_STATE_HOME:-~/.local/state}/vq-admin``;
* the driver's configuration: ``$VQ_ADMIN_CONFIG``, else
  ``${XDG_CONFIG_HOME:-~/.config}/vq/admin.toml``;
* the agent's own lock directory on a login host:
  ``${XDG_STATE_HOME:-~/.local/state}/vq-admin-agent/locks``, and the host's record
  beside it, ``.../vq-admin-agent/record``.

An empty variable counts as unset.  Standard library only; Python 3.8 and
later (the agent imports it on the login host; the launcher path imports it
too, so it stays this small).
"""

from __future__ import annotations

import os


def state_home() -> str:
    """``$XDG_STATE_HOME``, else ``~/.local/state``."""
    return os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")


def state_dir() -> str:
    """The driver's state directory when none is given: ``$VQ_ADMIN_STATE_DIR`` or the XDG default."""
    return os.environ.get("VQ_ADMIN_STATE_DIR") or os.path.join(state_home(), "vq-admin")


def config_home() -> str:
    """``$XDG_CONFIG_HOME``, else ``~/.config``."""
    return os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")


def config_path() -> str:
    """The configuration file when none is given: ``$VQ_ADMIN_CONFIG`` or the XDG default."""
    return os.environ.get("VQ_ADMIN_CONFIG") or os.path.join(config_home(), "vq", "admin.toml")


def agent_lock_dir() -> str:
    """The agent's lease directory when no scratch root is configured."""
    return os.path.join(state_home(), "vq-admin-agent", "locks")


def agent_record_dir() -> str:
    """The host's record (CONTRACT section 12), beside the lease directory."""
    return os.path.join(state_home(), "vq-admin-agent", "record")
