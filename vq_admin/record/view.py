"""This driver's view of each host's record (CONTRACT section 12).

The driver's id is ``user@host/<8 hex>``, the hex created once in its state
directory (``driver-id``).  The entries of a host's record it has read are kept
in its state directory, with each one's verdict (:class:`~.signing.Verdict`),
by host and program::

    record/<host>/<program>.jsonl       (record/<host>/_helper.jsonl: the helper lane)

one JSON line per entry (:class:`Imported`), in the order of the host's
numbers; the last number is the cursor the next call asks after.  Each new
entry's signature is checked once, when it is imported, and its verdict kept
by the entry's digest (judged again only when ``allowed_signers`` changed).

Entries come in the answers a run already gets from the agent (the
``session`` of an update, the ``lease`` of a rollback or prune, ``record-read``
for ``history`` and ``attest``); a run's own entry goes back on the lease's
stdin (:meth:`vq_admin.lease.Lease.append`) before its receipt is stored.
"""

from __future__ import annotations

import functools
import getpass
import hashlib
import json
import os
import socket
from typing import TYPE_CHECKING, NamedTuple

from msgspec import UNSET

from .. import __version__
from ..config import Config, Signing
from ..core import protocol
from ..core.bounds import InputError
from ..document import Document, DocumentError, Sha256, given
from ..report.outcome import Refused
from ..report.sections import Record
from ..state.records import StateDir, Verified
from .signing import Signer, Verdict
from .statement import (FORGET, QUARANTINE, ROOTS, SUMMARY, VERIFIER_ID, Confirmed, Forget, Quarantine, Root, Roots,
                        Run, Statement, Subject, Summary, Verifier, policy_of)

if TYPE_CHECKING:
    from ..context import RunContext
    from ..launcher.registry import Entry
    from ..report.receipt import Receipt

HELPER = protocol.HELPER_RECORD
DRIVER_ID = "driver-id"
NO_SIGNING = "not checked: this driver has no [signing] table"


class Imported(Document, frozen=True, kw_only=True):
    """One entry of a host's record as this driver read it, with its verdict."""

    seq: int
    name: str
    digest: Sha256
    statement: str | None
    sig: str | None
    verdict: Verdict

    def parsed(self, kind: str | None = None) -> Statement | None:
        """The statement, or ``None`` when it is not one vq-admin reads; with *kind* (a predicate type), also
        ``None``, unparsed, when its text does not name it (most entries are verification summaries)."""
        if not self.statement or (kind is not None and kind not in self.statement):
            return None
        try:
            return Statement.parse(self.statement, f"record entry {self.name}")
        except (DocumentError, InputError):
            return None

    def run(self, kind: str | None = None) -> Run | None:
        """The run a verification summary records (:meth:`parsed` with *kind*), or ``None``."""
        statement = self.parsed(kind)
        summary = statement.summary if statement is not None else None
        return summary.vq_admin if summary is not None else None


def user_at_host() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid{os.geteuid()}"
    return f"{user}@{socket.gethostname()}"


def driver_id(state: StateDir) -> str:
    """This state directory's driver id, its hex created once (CONTRACT section 12)."""
    return _driver_id(str(state.root))


@functools.cache
def _driver_id(root: str) -> str:
    state = StateDir(root)
    found = state.tree.read([], DRIVER_ID, limit=64)
    if found is None:
        try:
            state.tree.write_atomic([], DRIVER_ID, os.urandom(4).hex().encode() + b"\n", exclusive=True)
        except FileExistsError:
            pass  # another run of this state directory created it first
        found = state.tree.read([], DRIVER_ID, limit=64) or b""
    hex_id = found.decode("ascii", "replace").strip()
    if len(hex_id) != 8 or any(c not in "0123456789abcdef" for c in hex_id):
        raise DocumentError(f"{state.root}/{DRIVER_ID}: not 8 lower-case hex digits")
    return f"{user_at_host()}/{hex_id}"


def _parts(host: str) -> list[str]:
    return ["record", host]


def _file(program: str | None) -> str:
    return f"{program or HELPER}.jsonl"


_READ: dict[tuple[str, str, str | None], tuple[tuple[int, int], list[Imported]]] = {}


def entries(state: StateDir, host: str, program: str | None) -> list[Imported]:
    """The entries of *host*'s record of *program* this driver has read, oldest first (parsed again only
    when the file changed)."""
    key = (str(state.root), host, program)
    try:
        st = os.stat(state.tree.path(*_parts(host), _file(program)), follow_symlinks=False)
        stamp = (st.st_size, st.st_mtime_ns)
    except OSError:
        stamp = (-1, -1)
    if key not in _READ or _READ[key][0] != stamp:
        _READ[key] = (stamp, _entries(state, host, program))
    return _READ[key][1]


def _entries(state: StateDir, host: str, program: str | None) -> list[Imported]:
    data = state.tree.read(_parts(host), _file(program)) or b""
    found: dict[int, Imported] = {}
    for line in data.splitlines():
        try:
            entry = Imported.from_json(line, "record entry")
        except (DocumentError, InputError):
            continue  # a line a crash cut short: the entry is asked for again
        found.setdefault(entry.seq, entry)
    return [found[seq] for seq in sorted(found)]


def cursor(state: StateDir, host: str, program: str | None) -> int:
    known = entries(state, host, program)
    return known[-1].seq if known else 0


@functools.cache
def signer(signing: Signing | None) -> Signer | None:
    """The run's :class:`Signer` (its paths judged once), ``None`` without ``[signing]``."""
    return None if signing is None else Signer(signing)


def judge(signing: Signer | None, name: str, statement: bytes | None, sig: bytes | None) -> Verdict:
    """The verdict on one entry as read from the host."""
    if statement is None:
        return Verdict(accepted=False, reason="unreadable (its statement is missing or not text)")
    if not name.split(".")[0].endswith("-" + hashlib.sha256(statement).hexdigest()[:16]):
        return Verdict(accepted=False, reason="altered (its statement's digest is not the one its name records)")
    if signing is None:
        return Verdict(accepted=False, reason="unsigned" if sig is None else NO_SIGNING)
    return signing.judge(statement, sig)


class _Read(NamedTuple):
    """One entry as an agent's answer gives it: a statement or signature that is not text is none."""

    seq: int
    name: str
    statement: str | None
    sig: str | None


def _after(raw_entries: list[object], last: int) -> list[_Read]:
    """The entries of an answer's list that follow *last* (this driver's cursor), in order; an item that is no
    object with an integer ``seq`` is skipped."""
    fresh: list[_Read] = []
    for raw in raw_entries:
        if isinstance(raw, dict) and isinstance(raw.get("seq"), int) and raw["seq"] > last:
            fresh.append(_Read(raw["seq"], str(raw.get("name")), _text(raw.get("statement")), _text(raw.get("sig"))))
            last = raw["seq"]
    return fresh


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _judged(signing: Signer | None, fresh: list[_Read]) -> list[Imported]:
    """Each entry of *fresh* with its verdict, as this driver keeps it (judged in parallel: one ssh-keygen per
    signed entry)."""
    def verdict(read: _Read) -> Verdict:
        return judge(signing, read.name, _encoded(read.statement), _encoded(read.sig))

    if not fresh:
        return []
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        verdicts = list(pool.map(verdict, fresh))
    return [Imported(seq=read.seq, name=read.name, digest=hashlib.sha256((read.statement or "").encode()).hexdigest(),
                     statement=read.statement, sig=read.sig, verdict=found)
            for read, found in zip(fresh, verdicts, strict=True)]


def _encoded(text: str | None) -> bytes | None:
    return None if text is None else text.encode()


def take(config: Config, state: StateDir, host: str, program: str | None, answer: object) -> Record:
    """Import the entries of an agent answer's ``record`` member (those after this driver's cursor):
    each judged once and kept; what the receipt says of them (``imported``, ``not_evidence``)."""
    if not isinstance(answer, dict) or not isinstance(answer.get("entries"), list):
        return Record(imported=0, error="the agent answered no record")
    new = _judged(signer(config.signing), _after(answer["entries"], cursor(state, host, program)))
    error = str(answer.get("error") or "") or UNSET
    if not new:
        return Record(imported=0, error=error)
    rejected = [f"{entry.name}: {entry.verdict.reason}" for entry in new if not entry.verdict.accepted]
    recalled = _quarantines(config, state, host, program, new) if program else []  # before the cursor moves
    state.tree.append(_parts(host), _file(program), b"".join(entry.to_json().encode() + b"\n" for entry in new))
    adopted = adopt(state, host, program, new, confirms(config, host, program), rejected)
    return Record(imported=len(new), quarantine=recalled or UNSET, evidence=adopted or UNSET,
                  not_evidence=rejected[:20] or UNSET, error=error)


def confirms(config: Config, host: str, program: str | None) -> bool:
    """Whether this driver's profile of *program* on *host* has ``confirm_command``."""
    profile = config.hosts[host].runtimes.get(program or "") if host in config.hosts else None
    return profile is not None and profile.confirm is not None


def _quarantines(config: Config, state: StateDir, host: str, program: str, new: list[Imported]) -> list[str]:
    """The quarantines and lifts among the new entries, acted on here (CONTRACT section 14); one that cannot be
    is refused (77) before the entries are kept, so the next contact acts on it again."""
    from ..launcher.registry import RegistryError

    try:
        return apply_record(state, host, program, new, config.signing is not None)
    except (RegistryError, OSError) as exc:
        raise Refused(f"cannot act on a quarantine of the host's record of {program} on {host}: {exc}") from None


def apply_record(state: StateDir, host: str, program: str, new: list[Imported], signing: bool) -> list[str]:
    """Act on the quarantine and lift entries among *new* entries of *host*'s record of *program* (CONTRACT
    section 14), oldest first: a quarantine marks its SHA here as ``vq admin quarantine`` does, signed or not
    (it only refuses more); a lift ends it only when signed by a key ``allowed_signers`` accepts, or, without
    ``[signing]`` (not *signing*), unsigned too, and only when its ``at`` is later than the quarantine mark's
    here (a replayed or late-imported older lift never ends a newer quarantine).  What was done, one line each."""
    from ..launcher import registry

    done: list[str] = []
    for entry, found in _quarantine_entries(new, program):
        mark = registry.quarantined(state.root, host, program, found.sha)
        later = mark is None or found.at > mark.at  # than the quarantine it would replace or end
        if found.action == "quarantine":
            if later:  # else a later mark is there (an older lift could end that)
                reason = found.reason if found.reason and found.reason.isprintable() else "?"  # printed by refusals
                registry.mark_quarantined(state.root, host, program, found.sha, reason, found.at, found.by)
            done.append(f"quarantined {found.sha} ({entry.name}, by {found.by})")
            continue
        why_not = _why_not_lifted(entry, found, host, later, signing)
        if why_not is not None:
            done.append(f"not lifted {found.sha} ({entry.name}: {why_not})")
        else:
            registry.lift_quarantine(state.root, host, program, found.sha)
            done.append(f"lifted {found.sha} ({entry.name}, by {found.by})")
    return done


def _quarantine_entries(new: list[Imported], program: str) -> list[tuple[Imported, Quarantine]]:
    """The quarantine and lift entries of *program* among *new* entries, with their predicates."""
    found = []
    for entry in new:
        statement = entry.parsed(QUARANTINE)
        pred = statement.predicate if statement is not None else None
        if isinstance(pred, Quarantine) and pred.program == program:
            found.append((entry, pred))
    return found


def _why_not_lifted(entry: Imported, lift: Quarantine, host: str, later: bool, signing: bool) -> str | None:
    """Why a lift entry does not end the quarantine here; ``None`` when it does."""
    if signing and not entry.verdict.accepted:
        return entry.verdict.reason or "unaccepted"
    if lift.host != host:
        return "another host"
    return None if later else "older than the quarantine it would end"


#: The ``receipt`` a registry entry or LAST OK imported from the host's record names: ``record:<entry name>``.
FROM_RECORD = "record:"


def adopt(state: StateDir, host: str, program: str | None, new: list[Imported], confirm: bool,
          skipped: list[str]) -> list[str]:
    """Make the accepted verification summaries among *new* entries of other drivers this driver's evidence
    (CONTRACT section 12): the registry holds their launchers, and LAST OK / LAST GOOD follow the newest
    (when newer than this driver's LAST OK).  Never one whose own SHA's confirmation failed, nor, when this
    driver's profile has ``confirm_command`` (*confirm*), one without a passed confirmation of its SHA
    (section 13; named in *skipped*); a passed one becomes this driver's baseline when it has none.  The
    entry names of what was adopted."""
    from ..launcher import registry

    me, adopted = driver_id(state), []
    for entry in new:
        run = _others_run(entry, me, host, program)
        if run is None or program is None:
            continue
        why = run.unconfirmed(confirm)
        if why is not None:
            skipped.append(f"{entry.name}: {why}")
            continue
        if registry.pruned(state.root, host, program, run.sha) is not None:
            continue  # pruned here: only a verification of this driver makes it evidence again (never a replay)
        verified = Verified(sha=run.sha, tag=run.tag, launcher=run.launcher, launcher_sha256=run.launcher_sha256,
                            receipt=FROM_RECORD + entry.name, at=run.finished_at, verified_by=run.by,
                            driver=run.driver, signer=entry.verdict.principal)  # what it stands for here
        try:
            _, apply = registry.plan_verified(state.root, host, program, verified)
            apply()
        except (registry.RegistryError, OSError, ValueError):
            continue  # not registrable (no launcher): never evidence
        last_ok = state.verified("runtime", host, program)
        if last_ok is None or (last_ok.at or "") <= run.finished_at:
            state.move_last_ok("runtime", host, program, verified)
        _adopt_confirmation(state, host, program, entry, run)
        adopted.append(entry.name)
    return adopted


def _others_run(entry: Imported, me: str, host: str, program: str | None) -> Run | None:
    """The runtime run of *program* on *host* an accepted entry of another driver verified, or ``None`` (an
    entry copied from another host's record is not this host's evidence)."""
    run = entry.run() if entry.verdict.accepted else None
    if run is None or run.driver == me or (run.lane, run.host, run.program) != ("runtime", host, program):
        return None
    return run


def _adopt_confirmation(state: StateDir, host: str, program: str, entry: Imported, run: Run) -> None:
    """A passed confirmation of the run's own SHA becomes this driver's baseline when it has none."""
    from ..state import confirmation

    c = run.confirm
    if c is not None and c.sha == run.sha and not confirmation.read(state, host, program).get(run.sha):
        confirmation.record(state, host, program, run.sha, confirmation.ConfirmEntry(
            status=confirmation.PASSED, job_id=c.job_id, state=c.state, exit_code=c.exit_code, node=c.node,
            metrics=c.metrics, accepted_regression=c.accepted_regression, receipt=FROM_RECORD + entry.name))


def record_problem(state: StateDir, host: str, program: str, entry: Entry, signing: Signing | None) -> str | None:
    """Why a registry entry imported from the host's record is not (or no longer) evidence; ``None`` when an
    entry of the record, signed by a key the current *signing*'s allowed_signers accepts, verified exactly that
    launcher."""
    name = entry.receipt[len(FROM_RECORD):]
    found = next((e for e in entries(state, host, program) if e.name == name), None)
    if found is None or not verdict_now(found, signer(signing)).accepted:
        return f"the registry names the host's record entry {name}, which is not evidence here"
    run = found.run()
    if run is None or (run.sha, run.launcher, run.launcher_sha256) != (entry.sha, entry.launcher,
                                                                       entry.launcher_sha256):
        return f"the host's record entry {name} does not verify that launcher"
    return None


def verdict_now(entry: Imported, signing: Signer | None) -> Verdict:
    """*entry*'s verdict under the current ``allowed_signers`` (its kept one while the file is the same)."""
    kept = entry.verdict
    if signing is None:
        return kept if not kept.accepted else Verdict(accepted=False, reason=NO_SIGNING)
    if kept.allowed_signers_sha256 == signing.allowed_sha256:
        return kept  # judged with this very allowed_signers: never judged again
    return judge(signing, entry.name, _encoded(entry.statement), _encoded(entry.sig))


def newest_run(known: list[Imported]) -> Run | None:
    """The run the newest verification summary of *known* entries records."""
    for entry in reversed(known):
        run = entry.run(SUMMARY)
        if run is not None:
            return run
    return None


def run_statement(ctx: RunContext, receipt: Receipt, verified: Verified) -> Statement:
    """The entry of a run that ended with *verified* (a verification summary of its launcher)."""
    host = ctx.config.hosts[receipt.host]
    profile = host.runtimes.get(receipt.program or "")
    repo = profile.source_repo if profile else host.helper_source_repo
    run = _run(ctx, receipt, verified)
    policy = policy_of(profile.verify_command if profile and profile.verify_command else ["helper identity"])
    summary = Summary(verifier=Verifier(id=VERIFIER_ID, version={"vq-admin": __version__}),
                      time_verified=run.finished_at, resource_uri=f"git+file://{repo or ''}@{run.sha}",
                      policy=policy, vq_admin=run)
    digest = given(verified.launcher_sha256) or given(verified.tree_sha256)
    subject = (Subject(name=str(run.launcher), digest={"sha256": digest}),) if run.launcher and digest else ()
    return Statement(subject=subject, predicate_type=SUMMARY, predicate=summary)


def _run(ctx: RunContext, receipt: Receipt, verified: Verified) -> Run:
    """The run itself, as its entry records it (the summary's ``vqAdmin`` member)."""
    archive_sha256, tree_sha256 = (receipt.source.archive_sha256, receipt.source.tree_sha256) if receipt.source \
        else (None, None)
    confirmed = receipt.reverted.from_ if receipt.reverted else verified.sha
    return Run(run_id=receipt.id, lane="runtime" if receipt.program else "helper",
               verb=receipt.rerun[2] if receipt.rerun else "update",
               outcome=receipt.outcome.value if receipt.outcome else "ok", host=receipt.host, program=receipt.program,
               sha=verified.sha, tag=given(verified.tag), launcher=given(verified.launcher) or given(verified.path),
               launcher_sha256=given(verified.launcher_sha256), archive_sha256=archive_sha256,
               tree_sha256=tree_sha256, verifier_receipt_sha256=_shown_sha256(receipt),
               started_at=receipt.started_at, finished_at=receipt.finished_at or "", driver=driver_id(ctx.state),
               by=user_at_host(), confirm=confirm_of(ctx.state, receipt.host, receipt.program, confirmed))


def _shown_sha256(receipt: Receipt) -> str | None:
    """The SHA-256 of the verify receipt the run's final verify showed (its JSON, keys sorted), or ``None``."""
    shown = (receipt.verify.final or {}).get("receipt")  # a JSON object, or unset
    return hashlib.sha256(json.dumps(shown, sort_keys=True).encode()).hexdigest() if shown else None


def confirm_of(state: StateDir, host: str, program: str | None, sha: str) -> Confirmed | None:
    """*sha*'s confirmation as this driver's own jobs established it (CONTRACT section 13: what Slurm reported
    for the job a run submitted; never one imported from the host's record, never a pending one)."""
    from ..state import confirmation

    e = confirmation.read(state, host, program).get(sha) if program else None
    if e is None or e.status == confirmation.PENDING or (e.receipt or "").startswith(FROM_RECORD):
        return None
    return Confirmed(sha=sha, status="passed" if e.status == confirmation.PASSED else "unconfirmed", job_id=e.job_id,
                     state=e.state, exit_code=e.exit_code, node=e.node, metrics=e.metrics,
                     accepted_regression=e.accepted_regression, reason=e.reason)


def append_run(ctx: RunContext, receipt: Receipt, verified: Verified) -> Record | None:
    """Sign (under ``[signing]``) and append the entry of a verified run on the lease it holds; what the
    receipt's ``record`` section says of it.  An ``already-current`` run whose identity and tag the newest
    entry of the host already records appends nothing."""
    lease = ctx.held_lease
    if lease is None or lease.host_record is None:  # no lease held, or an agent without the record
        return None
    known = entries(ctx.state, receipt.host, receipt.program)
    newest = newest_run(known)
    if (receipt.outcome is not None and receipt.outcome.value == "already-current" and newest is not None
            and (newest.sha, newest.launcher_sha256, newest.tag, newest.confirm)
            == (verified.sha, given(verified.launcher_sha256), given(verified.tag),
                confirm_of(ctx.state, receipt.host, receipt.program, verified.sha))):
        return Record(entry=None, unchanged=known[-1].name)
    return _append(ctx, run_statement(ctx, receipt, verified))


def roots_now(state: StateDir, host: str, program: str, verified: Verified | None) -> tuple[Root, ...]:
    """This driver's roots once the run's *verified* identity (if any) is LAST OK: LAST OK and LAST GOOD."""
    last_ok, last_good = state.verified("runtime", host, program), state.verified("runtime", host, program, "last-good")
    if verified is not None and (last_ok is None or verified.sha != last_ok.sha):
        last_ok, last_good = verified, last_ok or last_good
    return tuple(Root(kind=kind, sha=found.sha, launcher=found.launcher or None,
                      launcher_sha256=found.launcher_sha256 or None)
                 for kind, found in (("last-ok", last_ok), ("last-good", last_good)) if found is not None)


def newest_roots(known: list[Imported], signing: bool) -> dict[str, Roots]:
    """Every driver's newest roots in *known* entries, less those a forget-driver entry dropped after them.
    Under ``[signing]`` (*signing*, CONTRACT section 12) only accepted entries replace or drop roots: a driver's
    are its accepted entry with the latest ``at`` (a replayed older one never wins), with the roots of its newest
    unaccepted entry added, never replacing them; only an accepted forget drops them."""
    found: dict[str, Roots] = {}  # the newest in the record's order (under [signing]: of the unaccepted ones)
    signed: dict[str, Roots] = {}
    for entry in known:
        statement = entry.parsed(ROOTS) or entry.parsed(FORGET)  # a verification summary (most entries): unparsed
        pred = statement.predicate if statement is not None else None
        if isinstance(pred, Roots) and signing and entry.verdict.accepted:
            if pred.driver not in signed or signed[pred.driver].at <= pred.at:
                signed[pred.driver] = pred
        elif isinstance(pred, Roots):
            found[pred.driver] = pred
        elif isinstance(pred, Forget) and (entry.verdict.accepted or not signing):
            found.pop(pred.forgotten, None)
            signed.pop(pred.forgotten, None)
    for driver, kept in signed.items():
        more = tuple(r for r in found[driver].roots if r not in kept.roots) if driver in found else ()
        found[driver] = kept.replace(roots=kept.roots + more)
    return found


def append_roots(ctx: RunContext, receipt: Receipt, verified: Verified | None) -> str | None:
    """At every contact: record this driver's roots on the host when they changed (CONTRACT section 12); the
    entry's name, or ``None`` when nothing was appended."""
    lease, program = ctx.held_lease, receipt.program
    if lease is None or lease.host_record is None or program is None or ctx.options.dry_run:
        return None
    roots, me = roots_now(ctx.state, receipt.host, program, verified), driver_id(ctx.state)
    known = newest_roots(entries(ctx.state, receipt.host, program), False).get(me)
    if not roots or (known is not None and known.roots == roots):
        return None
    predicate = Roots(driver=me, by=user_at_host(), host=receipt.host, program=program,
                      at=receipt.finished_at or "", roots=roots)
    subject = tuple(Subject(name=r.launcher, digest={"sha256": r.launcher_sha256}) for r in roots
                    if r.launcher and r.launcher_sha256)
    return given(_append(ctx, Statement(subject=subject, predicate_type=ROOTS, predicate=predicate)).entry)


def forget_driver(ctx: RunContext, receipt: Receipt, forgotten: str) -> Record:
    """Record that this driver drops the retired driver *forgotten*'s roots (``prune --forget-driver``)."""
    predicate = Forget(driver=driver_id(ctx.state), by=user_at_host(), host=receipt.host, program=receipt.program,
                       at=receipt.started_at, forgotten=forgotten)
    return _append(ctx, Statement(subject=(), predicate_type=FORGET, predicate=predicate))


def _append(ctx: RunContext, statement: Statement) -> Record:
    """Sign (under ``[signing]``) and append *statement* on the run's lease: ``entry`` and ``signed``, or ``error``."""
    lease = ctx.held_lease
    if lease is None or lease.host_record is None:
        return Record(entry=None, error="no host-side lease with the host's record is held")
    data = statement.to_text()
    signing = signer(ctx.config.signing)
    try:
        sig = signing.sign(data) if signing is not None else None
    except Refused as exc:
        return Record(entry=None, error=exc.message)
    answer = lease.append(data, sig)
    appended = answer.get("appended")
    if not isinstance(appended, dict):
        return Record(entry=None, error=str(answer.get("append_error") or "the agent did not answer the append"))
    return Record(entry=appended.get("name"), signed=sig is not None)


#: Bound on one ``record-read`` call (``history HOST``, ``attest``).
READ_TIMEOUT = 60.0


def fetch(config: Config, state: StateDir, host_name: str, programs: list[str | None]) -> dict[str | None, Record]:
    """Read *host_name*'s record of each of *programs* after this driver's cursors in one agent call
    (``record-read``) and import it: what :func:`take` says of each; raises
    :class:`~vq_admin.report.outcome.VqAdminError` when the host did not answer."""
    from ..report.outcome import VqAdminError
    from ..ssh.transport import Session

    host = config.hosts[host_name]
    signer(config.signing)
    with Session(config.ssh_config) as session:
        transport = session.for_host(host.transport, host.ssh)
        argv = protocol.record(host.agent, {program: cursor(state, host_name, program) for program in programs})
        done = transport.run(argv, timeout=READ_TIMEOUT)
    try:
        records = protocol.parse_record(done.stdout)["records"]
    except protocol.ProtocolError as exc:
        raise VqAdminError(f"cannot read the record of {host_name}: {done.describe() if done.exit_code else exc}") \
            from None
    return {program: take(config, state, host_name, program, records.get(program or HELPER))
            for program in programs}
