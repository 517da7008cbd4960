"""The words of vq-admin's ssh command lines.

The one set of ssh client options, the login-shell probe, the literal-word
rule, the control directory's name and the argv of the run's connection
master live here, so :mod:`vq_admin.ssh.transport` and :mod:`vq_admin.ssh.process`
build the one ssh command line from the same words.
"""

from __future__ import annotations

import re
import shlex

TYPE_CHECKING = False  # not typing's: on the launcher's --check-on-host path (vq_admin.ssh.process)
if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

#: The ssh client options of every ssh vq-admin starts (commands, the login-shell probe, the run's
#: connection master, the launcher's read-back): never a prompt, a bounded connect, a dead peer
#: noticed within a minute, no forwarding.
SSH_OPTIONS = (
    "-o", "BatchMode=yes",
    "-o", "ConnectTimeout=15",
    "-o", "ServerAliveInterval=15",
    "-o", "ServerAliveCountMax=4",
    "-o", "ClearAllForwardings=yes",
    "-T",
)

#: The login-shell probe (see :meth:`vq_admin.ssh.transport.SshTransport.check_login_shell`) and what a
#: POSIX shell prints for it.
SHELL_PROBE = ("printf", "%s|", "a b", "c'd", "e\\\\f", "$HOME", "`x`", "!x", "g\nh", "*", "~", "{a,b}", "^x", "#c")
SHELL_PROBE_EXPECTED = "".join(f"{w}|" for w in SHELL_PROBE[2:]).encode()

#: Where a run's control directory (its ssh connection sharing) is made: ``/tmp/vqssh-<pid>-*``.
CONTROL_PARENT = "/tmp"
CONTROL_PREFIX = "vqssh-"

#: A word that sh, bash, dash, ksh, zsh, tcsh and fish all read as itself: no quoting, globbing,
#: expansion, history or job syntax (no leading "-", "~" or "=").
LITERAL_WORD_RE = re.compile(r"\A[A-Za-z0-9_./,+][A-Za-z0-9_./,+-]*\Z")


#: A word those shells all read as itself inside single quotes: printable ASCII but the quote, the
#: backslash (fish) and "!" (csh history): the judge's ``-c`` code (:mod:`vq_admin.core.agentjudge`).
QUOTABLE_WORD_RE = re.compile(r'\A[ "-&(-\[\]-~]*\Z')


def shell_word(word: str) -> str | None:
    """*word* as every shell reads it literally: itself (:data:`LITERAL_WORD_RE`), single-quoted
    (:data:`QUOTABLE_WORD_RE`), or ``None``."""
    return word if LITERAL_WORD_RE.match(word) else f"'{word}'" if QUOTABLE_WORD_RE.match(word) else None


def literal_word(word: str) -> bool:
    """:data:`LITERAL_WORD_RE`."""
    return bool(LITERAL_WORD_RE.match(word))


def literal_words(words: Iterable[str]) -> bool:  # the configured agent's words (the early session's rule)
    """True when every word is literal (:func:`literal_word`: safe to send before the login shell is known)."""
    return all(literal_word(w) for w in words)


def ssh_words(ssh_config: str | None) -> list[str]:
    """``ssh``, the ``-F`` file when there is one, and :data:`SSH_OPTIONS`: how every ssh command line starts."""
    return ["ssh"] + (["-F", ssh_config] if ssh_config else []) + list(SSH_OPTIONS)


def master_argv(ssh_config: str | None, control_dir: str | None, master: bool, destination: str,
                words: Sequence[str]) -> list[str]:
    """*words* (literal words) on *destination* as the run's connection master when *master*
    (``ControlMaster=yes`` on the run's ControlPath, without ControlPersist, so the master is this
    ssh process and ends with its own session), else riding on the master already up; a plain
    connection without a control directory (connection sharing off)."""
    base = ssh_words(ssh_config)
    if control_dir and master:
        base += ["-o", "ControlMaster=yes", "-o", f"ControlPath={control_dir}/%C", "-o", "ControlPersist=no"]
    elif control_dir:
        base += ["-o", "ControlMaster=no", "-o", f"ControlPath={control_dir}/%C"]
    return [*base, "--", destination, " ".join(shell_word(w) or w for w in words)]


def probe_suffix() -> str:
    """What a first contact's session command line ends with: ``--probe`` and the login-shell probe's
    words, quoted for a POSIX shell (the agent judges what reached it)."""
    from ..core import protocol

    return " " + " ".join(shlex.quote(w) for w in protocol.session_probe(SHELL_PROBE[2:]))
