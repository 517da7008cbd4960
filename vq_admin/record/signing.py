"""Signing and checking the host's record entries with the ssh keys a site already has (CONTRACT section 12).

With a ``[signing]`` table the driver signs each entry it appends with
``ssh-keygen -Y sign`` in the namespace ``vq-admin-record`` (on the driver
only: never on a build host or in an allocation) and checks each entry it
imports once, with ``ssh-keygen -Y verify`` against ``allowed_signers``:

* no signature: ``unsigned``;
* a signature by a key no line of ``allowed_signers`` names (read from the
  signature's own public key, and asked of ``ssh-keygen -Y find-principals``
  when no plain key line matches it, e.g. a certificate authority): ``signed by
  a key not in allowed_signers``;
* a known key whose signature does not verify: ``altered``.

The key, ``allowed_signers``, ``ssh-keygen`` itself and what it loads
(``SSH_SK_PROVIDER``, the agent socket ``SSH_AUTH_SOCK``) must pass the
secure-path rule; otherwise the run is refused (77).
"""

from __future__ import annotations

import base64
import hashlib
import os
import tempfile
from collections.abc import Callable

from ..config import Signing
from ..core import securepath
from ..core.atomic import TEMP_FLAGS
from ..document import Document
from ..report.outcome import Refused
from ..ssh import process

NAMESPACE = "vq-admin-record"
TIMEOUT = 30.0
ARMOR = ("-----BEGIN SSH SIGNATURE-----", "-----END SSH SIGNATURE-----")


class Verdict(Document, frozen=True, kw_only=True):
    """Whether an entry is evidence: ``principal`` (from allowed_signers) when accepted, else ``reason``."""

    accepted: bool
    principal: str | None = None
    reason: str | None = None
    #: the SHA-256 of the allowed_signers file the verdict was reached with (a new file: judged again)
    allowed_signers_sha256: str | None = None


class Signer:
    """The ``[signing]`` table, checked once: its paths and ssh-keygen's trusted."""

    def __init__(self, signing: Signing) -> None:
        self.key, self.allowed = signing.key, signing.allowed_signers
        keygen = process.find_program("ssh-keygen")
        if keygen is None:
            raise Refused("[signing]: ssh-keygen is not on PATH; nothing was signed or checked")
        self.keygen = os.path.realpath(keygen)
        judged = [(self.key, "[signing] key", False), (self.allowed, "[signing] allowed_signers", False),
                  (keygen, "ssh-keygen", False), (self.keygen, "ssh-keygen", False)]
        judged += [(os.environ[name], name, True) for name in ("SSH_SK_PROVIDER", "SSH_AUTH_SOCK")
                   if os.environ.get(name)]  # a stale agent socket: judged by the directories above it
        for path, what, missing_ok in judged:
            problem = securepath.path_problem(path, what=what, missing_ok=missing_ok)
            if problem:
                raise Refused(f"{problem}; ssh-keygen signs and checks the host's record with it: refusing")
        try:
            with open(self.allowed, "rb") as fh:
                self.allowed_text = fh.read(1 << 20)
        except OSError as exc:
            raise Refused(f"[signing] allowed_signers {self.allowed}: {exc.strerror}") from None
        self.allowed_sha256 = hashlib.sha256(self.allowed_text).hexdigest()

    def sign(self, data: bytes) -> bytes:
        """The detached signature of *data* (``ssh-keygen -Y sign``), or :class:`Refused` naming why not."""
        done = process.run([self.keygen, "-Y", "sign", "-f", self.key, "-n", NAMESPACE], stdin=data, timeout=TIMEOUT)
        if not done.ok or not done.stdout.startswith(ARMOR[0].encode()):
            reason = done.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [f"exit {done.exit_code}"]
            raise Refused(f"[signing]: ssh-keygen -Y sign with {self.key} failed: {reason[0]}; no entry written")
        return done.stdout

    def judge(self, data: bytes, sig: bytes | None) -> Verdict:
        """The verdict on one entry (its statement *data*, its signature *sig*)."""
        if sig is None:
            return self._verdict(None, "unsigned")
        key = signature_key(sig)
        if key is None:
            return self._verdict(None, "altered (its signature is not an SSH signature)")
        principal = self._principal(key) or self._find_principal(sig)
        if principal is None:
            return self._verdict(None, "signed by a key not in allowed_signers")
        done = self._with_sig(sig, lambda path: process.run(
            [self.keygen, "-Y", "verify", "-f", self.allowed, "-I", principal, "-n", NAMESPACE, "-s", path],
            stdin=data, timeout=TIMEOUT))
        if done.ok:
            return self._verdict(principal, None)
        return self._verdict(None, f"altered (its signature by {principal} does not verify)")

    def _verdict(self, principal: str | None, reason: str | None) -> Verdict:
        return Verdict(accepted=principal is not None, principal=principal, reason=reason,
                       allowed_signers_sha256=self.allowed_sha256)

    def _principal(self, key: str) -> str | None:
        """The first principal of the plain key line of allowed_signers that names *key* (base64), if any."""
        for line in self.allowed_text.decode("utf-8", "replace").splitlines():
            words = line.split()
            if words and not words[0].startswith("#") and key in words[1:]:
                return words[0].split(",")[0]
        return None

    def _find_principal(self, sig: bytes) -> str | None:
        done = self._with_sig(sig, lambda path: process.run(
            [self.keygen, "-Y", "find-principals", "-f", self.allowed, "-s", path], timeout=TIMEOUT))
        found = done.stdout.decode("utf-8", "replace").split()
        return found[0] if done.ok and found else None

    def _with_sig(self, sig: bytes, use: Callable[[str], process.Completed]) -> process.Completed:
        with tempfile.TemporaryDirectory(prefix="vq-admin-sig-") as tmp:
            path = os.path.join(tmp, "entry.sig")
            fd = os.open(path, TEMP_FLAGS, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(sig)
            return use(path)


def signature_key(sig: bytes) -> str | None:
    """The public key (base64, as allowed_signers writes it) inside an armored SSH signature, or ``None``."""
    text = sig.decode("ascii", "replace").strip()
    if not (text.startswith(ARMOR[0]) and text.endswith(ARMOR[1])):
        return None
    try:
        blob = base64.b64decode("".join(text[len(ARMOR[0]):-len(ARMOR[1])].split()), validate=True)
    except ValueError:
        return None
    if blob[:6] != b"SSHSIG" or len(blob) < 14:
        return None
    size = int.from_bytes(blob[10:14], "big")
    key = blob[14:14 + size]
    return base64.b64encode(key).decode() if len(key) == size and size else None
