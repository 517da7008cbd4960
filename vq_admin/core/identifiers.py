"""The one definition of every identifier vq-admin accepts: commits, digests, names, tags, lanes, hosts.

Every pattern is anchored at both ends (``\\A`` ... ``\\Z``, so a trailing
newline never passes) and, except :data:`FULL_SHA_RE`, case-sensitive.  The
driver, the launcher path and the agent all import these; none defines its
own.  ``vq_admin_hookspecs`` installs on its own and keeps its own copies
of four of them in ``vq_admin_hookspecs.records`` (``FULL_SHA_RE``,
``SHA256_RE``, ``NAME_RE``, ``ENV_NAME_RE``), for the records it validates
and the providers that import them; tests/test_identifiers.py checks they
are the same patterns.

Standard library only; Python 3.8 and later (the agent imports it on the
login host).
"""

from __future__ import annotations

import re

#: A full git object name as vq-admin records it: 40 (SHA-1) or 64 (SHA-256) lower-case hex digits.
SHA_RE = re.compile(r"\A(?:[0-9a-f]{40}|[0-9a-f]{64})\Z")
#: A full git object name as an operator may type it (either case; vq-admin lower-cases it).
FULL_SHA_RE = re.compile(r"\A(?:[0-9a-fA-F]{40}|[0-9a-fA-F]{64})\Z")
#: A full git object name (lower-case) inside a text, not part of a longer run of hex digits.
SHA_IN_TEXT_RE = re.compile(r"(?<![0-9a-f])(?:[0-9a-f]{64}|[0-9a-f]{40})(?![0-9a-f])")
#: A SHA-256 digest in lower-case hex.
SHA256_RE = re.compile(r"\A[0-9a-f]{64}\Z")
#: Program, host and provider names (:data:`NAME_RULE` names the rule in messages).
NAME_RULE = "[A-Za-z0-9][A-Za-z0-9._-]{0,63}"
NAME_RE = re.compile(rf"\A{NAME_RULE}\Z")
#: What a refused SHA's message asks for.
SHA_RULE = "give the full commit SHA: 40 (or 64) hex digits; abbreviations and ref names are not accepted"
#: Environment variable names a provider may set for its command.
ENV_NAME_RE = re.compile(r"\A[A-Za-z_][A-Za-z0-9_]*\Z")
#: git's ref name rules for refs/tags/<name>, narrowed to a safe alphabet: no "..", "//", "@{",
#: no component starting with "." or ending with ".lock", no trailing "." or "/".
TAG_RE = re.compile(r"\A(?!.*\.\.)(?!.*//)(?!.*@\{)(?!.*/\.)(?!.*\.lock/)"
                    r"[A-Za-z0-9_][A-Za-z0-9._/+-]{0,199}(?<![./])(?<!\.lock)\Z")
#: A git branch name (a mirror lane) we are willing to feed: a conservative subset of check-ref-format.
BRANCH_RE = re.compile(r"\A(?!.*\.\.)(?!.*//)(?!.*@\{)(?!.*/\.)(?!.*\.lock/)(?!HEAD\Z)"
                       r"[A-Za-z0-9][A-Za-z0-9._/-]{0,199}(?<![./])(?<!\.lock)\Z")
#: A Slurm job id as vq-admin passes it to squeue, scontrol and scancel: ASCII digits only (never an option).
JOB_ID_RULE = "[0-9]{1,20}"
JOB_ID_RE = re.compile(rf"\A{JOB_ID_RULE}\Z")
#: An ssh destination: never starts with "-" (that would be an ssh option).
DESTINATION_RE = re.compile(r"\A[A-Za-z0-9_][A-Za-z0-9_.@:+%-]{0,254}\Z")

#: The schema of a JSON document vq-admin prints: ``vq-admin/<name>/<version>``.
SCHEMA_RE = re.compile(r"\Avq-admin/[a-z][a-z0-9-]{0,63}/[1-9][0-9]{0,3}\Z")


def object_format(sha: str) -> str:
    """The object format (hash algorithm) of the repository a full git object name *sha* is from."""
    return "sha256" if len(sha) == 64 else "sha1"
