"""``vq admin attest PROGRAM HOST [--sha SHA] [--json] [--out DIR]``: the host's record entry of a generation.

Reads the host's record of PROGRAM (one agent call, ``record-read``; the entries
this driver has not seen are imported and judged) and prints the newest entry
that verified SHA there (default: the newest verified generation, the active
one): its in-toto statement and its ``ssh-keygen -Y sign`` signature, so a job
or a paper can cite exactly what ran.  ``--out DIR`` writes
``DIR/statement.json`` and ``DIR/statement.json.sig``, exactly as the host keeps
them, for ``ssh-keygen -Y verify -f allowed_signers -I PRINCIPAL -n
vq-admin-record -s statement.json.sig < statement.json``.  Under ``[signing]``
only an entry signed by a key ``allowed_signers`` accepts is attested; without
it the newest entry is printed, unsigned (exit 0, ``signed`` false).  Exit 77
when no entry attests the generation.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from ..config import authority, load_config
from ..document import Document
from ..record import view
from ..record.signing import NAMESPACE, Signer
from ..record.statement import Statement
from ..report.envelope import SCHEMAS, emit
from ..report.outcome import Outcome, Refused
from ..report.output import safe_text
from ..ssh.transport import quote_argv
from ..state.records import StateDir, write_atomic


def chosen(known: list[view.Imported], signing: Signer | None, sha: str | None) -> view.Imported | None:
    """The newest entry verifying *sha* (any SHA: the newest verified generation) this driver may attest."""
    for entry in reversed(known):
        statement = entry.parsed()
        summary = statement.summary if statement is not None else None
        if summary is None or (sha is not None and summary.vq_admin.sha != sha):
            continue
        if signing is None or view.verdict_now(entry, signing).accepted:
            return entry
    return None


class Attestation(Document, frozen=True, kw_only=True):
    """``vq admin attest --json``'s data: an entry of the host's record, its statement and how to check it."""

    program: str
    host: str
    entry: str
    seq: int
    signed: bool
    principal: str | None
    reason: str | None
    statement: Statement
    statement_text: str
    signature: str | None
    files: dict[str, str]
    verify_command: str


def run(args: argparse.Namespace) -> int:
    from .arguments import check_name, full_sha

    check_name(args.program, "PROGRAM")
    check_name(args.host, "HOST")
    sha = full_sha(args.sha, "--sha")
    config = load_config(args.config)
    host, _ = authority.runtime_profile(config, args.host, args.program)
    state = StateDir(args.state_dir)
    view.fetch(config, state, host.name, [args.program])
    signing = view.signer(config.signing)
    entry = chosen(view.entries(state, host.name, args.program), signing, sha)
    if entry is None or entry.statement is None:
        what = f"{args.program} {sha}" if sha else f"a verified generation of {args.program}"
        raise Refused(f"no entry of {host.name}'s record attests {what}"
                      + (" signed by a key allowed_signers accepts" if signing else "") + "; nothing to attest")
    verdict = view.verdict_now(entry, signing)
    principal = verdict.principal or "PRINCIPAL"
    allowed = config.signing.allowed_signers if config.signing else "allowed_signers"
    files: dict[str, str] = {}
    if args.out:
        out = os.path.abspath(args.out)
        files["statement"] = os.path.join(out, "statement.json")
        write_atomic(Path(files["statement"]), entry.statement.encode())
        if entry.sig is not None:
            files["signature"] = files["statement"] + ".sig"
            write_atomic(Path(files["signature"]), entry.sig.encode())
    verify = quote_argv(["ssh-keygen", "-Y", "verify", "-f", allowed, "-I", principal, "-n", NAMESPACE, "-s",
                         files.get("signature", "statement.json.sig")]) + " < " + quote_argv(
                             [files.get("statement", "statement.json")])
    doc = Attestation(program=args.program, host=host.name, entry=entry.name, seq=entry.seq,
                      signed=entry.sig is not None, principal=verdict.principal, reason=verdict.reason,
                      statement=Statement.parse(entry.statement, entry.name), statement_text=entry.statement,
                      signature=entry.sig, files=files, verify_command=verify)
    if args.json:
        emit(SCHEMAS["attest"], Outcome.OK, doc.to_value())
    elif args.out:
        print(safe_text(f"{entry.name} of {host.name}: wrote {', '.join(files.values())}\ncheck it: {verify}"))
    else:
        print(entry.statement, end="")
        print(entry.sig or f"(unsigned: {verdict.reason})\n", end="")
    return 0
