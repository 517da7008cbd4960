"""The identifier rules of the vq-admin provider contract, one regular expression each.

Part of the ``vq-admin-hookspecs`` distribution, standard library only: a
provider's host-side command imports these without loading pluggy, and
:mod:`vq_admin_hookspecs` exports the same objects.  Each is anchored at both
ends (a trailing newline never passes) and, but :data:`FULL_SHA_RE`,
case-sensitive; they are vq-admin's own rules (its tests check they agree).
"""

import re

#: A full git object name: 40 (SHA-1) or 64 (SHA-256) hex digits, either case (store it lower case).
FULL_SHA_RE = re.compile(r"\A(?:[0-9a-fA-F]{40}|[0-9a-fA-F]{64})\Z")
#: A SHA-256 digest in lower-case hex.
SHA256_RE = re.compile(r"\A[0-9a-f]{64}\Z")
#: Program and host names.
NAME_RE = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
#: Environment variable names a provider may set for its command.
ENV_NAME_RE = re.compile(r"\A[A-Za-z_][A-Za-z0-9_]*\Z")
#: Release tags (``--tag``): git's ref name rules for refs/tags/<name>, narrowed to a safe alphabet.
TAG_RE = re.compile(r"\A(?!.*\.\.)(?!.*//)(?!.*@\{)(?!.*/\.)(?!.*\.lock/)"
                    r"[A-Za-z0-9_][A-Za-z0-9._/+-]{0,199}(?<![./])(?<!\.lock)\Z")
