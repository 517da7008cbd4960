"""One feed of the push-fed source mirror, step by step (see :mod:`vq_admin.source.mirror`).

:class:`Feed` runs probe -> read -> (test hook) -> push -> confirm through a
*runner*, so a lane can record each command as a plan step (real argv, exit
status, seconds) while this module stays independent of lanes.  The runner
gets each command as the plan shows it (:meth:`Feed.probe_command`,
:meth:`Feed.symref_command`, :meth:`Feed.read_command`), slots included,
and the values that fill them (``ref=...`` for each ``mirror-symrefs``
read): a lane runs its planned step with those values
(:func:`vq_admin.plan.execute`), :func:`plain_runner` fills and runs it::

    feed = Feed(login=transport, path="/srv/git/vibeqc.git", repo="/srv/src/vibeqc",
                sha=sha, lane="release", preparer_reads="lane", program="vibeqc", host="cluster")
    feed.feed()             # raises Refused (77), VqAdminError (1) or FeedUnknown (3)
    feed.to_receipt()       # the receipt's "mirror" object
"""

from __future__ import annotations

import shlex
from dataclasses import replace
from typing import Callable, NoReturn, Protocol

from .mirror import (
    LANE_PAIR, PIN_PREFIX, SYMREF_REFUSAL, FeedRef, FeedUnknown, Mirror, RACED, decide, full_ref, git_reason,
    lane_pair_refspecs, mirror_for, parse_ls_remote, parse_porcelain,
    probe_argv, probe_env, probe_refusal, push_template, read_argv, ref_set, refusal_text, run_test_hook, symref_argv,
)
from ..report.outcome import Refused, VqAdminError
from ..plan import SlotValue, fill, fill_env
from ..ssh.transport import LocalTransport, RunResult, Transport, quote_argv


class Runner(Protocol):
    """``runner(step name, transport, argv, env, timeout, **slot values) -> RunResult``: *argv* and
    *env* are the command as planned (slots included); the values fill its slots."""

    def __call__(self, name: str, transport: Transport, argv: list[str], env: dict[str, str], timeout: float,
                 **values: SlotValue) -> RunResult: ...

#: git push --porcelain reasons that mean "the mirror is not where vq-admin read it": refused (77).
MOVED_REASONS = ("non-fast-forward", "already exists", "fetch first", "stale info", "needs force")
LANE_FED = "fed"
LANE_LEFT = "left drifted (preparer reads the pin)"
LANE_NOT_FED = "not fed (refused)"


def plain_runner(name: str, transport: Transport, argv: list[str], env: dict[str, str], timeout: float,
                 **values: SlotValue) -> RunResult:
    """Run a feed command, its slots filled, without recording it anywhere."""
    filled_env = {key: fill_env(key, value, values) for key, value in env.items()}
    return transport.run(fill(argv, values), timeout=timeout, env=filled_env or None)


#: git's words (LC_ALL=C) for a connection lost after the push began talking to the mirror.
LOST_MID_PUSH = ("the remote end hung up unexpectedly", "unexpected disconnect while reading sideband packet")


def lost_mid_push(result: RunResult, lines: dict[str, tuple[str, str]], pushed: list[FeedRef]) -> bool:
    """True when git itself ended the push because its connection was lost before any pushed ref's report
    (an interruption of vq-admin's own, a timeout or a transport that never ran the command, is not)."""
    if result.interrupted is not None or result.exit_code == 0 or any(r.ref in lines for r in pushed):
        return False
    text = result.error_text()
    return any(words in text for words in LOST_MID_PUSH)


class Feed:
    """Feed *sha* of the driver checkout *repo* into the bare mirror *path* on the login host (*preparer_reads*:
    ``lane`` or ``pin``, as the configuration checked it)."""

    def __init__(self, *, login: Transport, path: str, repo: str, sha: str, lane: str, preparer_reads: str,
                 program: str, host: str, timeout: float = 3600.0, run: Runner = plain_runner,
                 before_push: Callable[[Mirror], None] | None = None, ssh_key: str = "ssh"):
        self.login, self.local = login, LocalTransport()
        self.mirror = mirror_for(login, path, ssh_key)
        self.repo, self.sha, self.lane, self.preparer_reads = repo, sha, lane, preparer_reads
        self.program, self.host, self.timeout = program, host, timeout
        self.run, self.before_push = run, before_push
        self.refs: list[FeedRef] = ref_set(repo, sha, lane)
        self.push: dict[str, object] = {"argv": None, "exit_code": None, "outcome": "not run"}
        self.lane_branch = "planned"
        self.notes: list[str] = []
        self._read_back: dict[str, str] | None = None  # set when a failed push was settled by reading back

    # -- what the plan shows ------------------------------------------------------------

    @property
    def source_ref(self) -> str:
        """The ref the site preparer must read: the pin, or the lane branch."""
        return PIN_PREFIX + self.sha if self.preparer_reads == "pin" else f"refs/heads/{self.lane}"

    @property
    def git_env(self) -> dict[str, str]:
        """The environment of every git command on the driver, as planned (its slots' values: the mirror's
        ``git_values``, the run's ssh control directory)."""
        return dict(self.mirror.git_env)

    def probe_command(self) -> tuple[list[str], dict[str, str]]:
        return probe_argv(self.mirror.path), probe_env(self.mirror.path)

    def symref_command(self) -> tuple[list[str], dict[str, str]]:
        """The read-only ``git symbolic-ref -q <ref>`` on the login host, run once per ref of the set
        (the ``ref`` slot filled with each)."""
        return symref_argv(self.mirror.path), probe_env(self.mirror.path)

    def read_command(self) -> list[str]:
        return read_argv(self.repo, self.mirror, self.refs)

    def push_command(self) -> list[str]:
        """The push as planned: every ref of the set, the lane's branch pair as the list slot
        ``[<lane branch pair>]...`` (:func:`~vq_admin.source.mirror.push_template`), which :meth:`push_values`
        fills once the read has decided."""
        return push_template(self.repo, self.mirror.url, self.refs)

    def push_values(self) -> dict[str, SlotValue]:
        """The values the push runs with: the branch pair's refspecs when it is fed (none when it is
        left drifted), and the run's ssh control directory.  The pin and every tag are fed: :meth:`read`
        refused the feed otherwise."""
        return {**self.mirror.git_values, LANE_PAIR.name: lane_pair_refspecs(self.refs)}

    # -- the feed ---------------------------------------------------------------------

    def feed(self) -> None:
        """Probe, read, decide, push, confirm; raise on anything but a proven feed."""
        self.probe()
        self.no_symrefs()
        self.read()
        run_test_hook(self.mirror, self.before_push)
        self.push_refs()
        self.confirm()

    def probe(self) -> None:
        argv, env = self.probe_command()
        result = self.run("mirror-probe", self.login, argv, env, 120.0)
        if result.interrupted:
            raise VqAdminError(f"mirror-probe: {result.describe()}; nothing was pushed")
        why = probe_refusal(self.mirror, result)
        if why:
            self.push["outcome"] = "not pushed: the mirror is not a bare repository"
            raise Refused(why)

    def no_symrefs(self) -> None:
        """Refuse (77) when any ref of the set is a symbolic ref on the mirror, dangling or not."""
        found = []
        argv, env = self.symref_command()
        for ref in self.refs:
            result = self.run("mirror-symrefs", self.login, argv, env, 120.0, ref=full_ref(ref.ref))
            if result.interrupted or result.exit_code not in (0, 1):
                raise VqAdminError(f"mirror-symrefs: cannot tell whether {ref.ref} is a symbolic ref in "
                                   f"{self.mirror.path} ({result.describe()}: {result.error_text()[-300:]}); "
                                   "nothing was pushed")
            if result.exit_code == 0:
                found.append(f"{ref.ref} is a symbolic ref to {result.text().strip() or '(unknown)'}")
        if found:
            self._not_fed("not pushed: a ref of the set is a symbolic ref on the mirror")
            raise Refused(SYMREF_REFUSAL.format(mirror=self.mirror.path, where=self.mirror.where,
                                                refs="; ".join(found), quoted=shlex.quote(self.mirror.path)))

    def read(self) -> None:
        """Read the mirror's values of the set and decide; refuse before any push."""
        held = self._read("mirror-read")
        if held is None:
            raise VqAdminError(f"cannot read the mirror {self.mirror.url} (see the mirror-read step); "
                               "nothing was pushed")
        decide(self.repo, self.refs, held)
        self.lane_branch = LANE_FED  # unless left drifted below, or a refusal stops the feed (_not_fed)
        branches = [r for r in self.refs if r.kind == "branch"]
        drifted = [r for r in branches if r.action == "refuse"]
        if drifted and self.preparer_reads == "pin":
            for ref in branches:
                ref.action = "left-drifted"
            self.lane_branch = LANE_LEFT
            self.notes.append(
                f"the lane branch pair of {self.mirror.path} on {self.mirror.where} has drifted ("
                + "; ".join(f"{r.ref} holds {r.old}" for r in drifted)
                + f"); it is left exactly as it is because the preparer reads {self.source_ref}")
        offending = [r for r in self.refs if r.action == "refuse"]
        if offending:
            self._nothing_changed("not pushed: refused before the push")
            raise Refused(refusal_text(self.mirror, offending, program=self.program, host=self.host))

    def push_refs(self) -> None:
        """The one atomic, unforced push; git's own refusal is the same refusal."""
        argv, values = self.push_command(), self.push_values()
        result = self.run("mirror-feed", self.local, argv, self.git_env, self.timeout, **values)
        self.push = {"argv": fill(argv, values), "exit_code": result.exit_code, "outcome": "pushed"}
        if result.ok:
            return
        lines = parse_porcelain(result.text())
        pushed = [r for r in self.refs if r.pushed]
        rejected = {ref: summary for ref, (flag, summary) in lines.items()
                    if flag == "!" and "atomic push failed" not in summary}
        held = self._read("mirror-confirm")
        # --atomic: when git itself reports every ref rejected or up to date, nothing was applied.
        if result.exit_code == 1 and rejected and all(lines.get(r.ref, ("?",))[0] in "!=" for r in pushed):
            self._refused_by_git(rejected, held)
        if held is not None:
            if all(held.get(r.ref) == r.requested for r in pushed):
                self.push["outcome"] = f"pushed (git exited {result.exit_code}; read-back shows every ref fed)"
                self._read_back = held
                return
            if all(held.get(r.ref) == r.old for r in pushed):
                self._untouched(result, lost_mid_push(result, lines, pushed))
        self.push["outcome"] = f"unknown: git exited {result.exit_code} and read-back could not tell what applied"
        raise FeedUnknown(f"mirror-feed: git push to {self.mirror.url} ended with {result.describe()} and the "
                          "mirror's refs could not be shown to be either fed or untouched")

    def _untouched(self, result: RunResult, lost: bool) -> NoReturn:
        """The read-back shows nothing applied: failed, or unknown when the connection was *lost* mid-push."""
        if lost:  # the pack went out and the mirror's report never came back: its receive (hooks, then the
            # ref updates) may still be running there, so "unchanged" is only "not yet"
            self.push["outcome"] = (f"unknown: git exited {result.exit_code} without the mirror's report; read-back "
                                    "shows nothing applied yet")
            raise FeedUnknown(f"mirror-feed: git push to {self.mirror.url} lost its connection before the mirror "
                              f"reported ({result.describe()}: {result.error_text()[-300:]}); read-back shows "
                              "nothing applied yet, but the mirror's receive may still be running and apply the "
                              f"push. Re-check with: {quote_argv(self.read_command())}")
        self._nothing_changed(f"failed: git exited {result.exit_code}; nothing changed")
        raise VqAdminError(f"mirror-feed: git push to {self.mirror.url} failed ({result.describe()}: "
                           f"{result.error_text()[-300:]}); read-back shows nothing changed")

    def confirm(self) -> None:
        """The mirror must now hold exactly what was pushed."""
        held = self._read_back if self._read_back is not None else self._read("mirror-confirm")
        if held is None:  # the push exited 0: the mirror may well have changed; only a read can tell
            self.push["outcome"] = "unknown: git push exited 0 but the mirror could not be read back"
            raise FeedUnknown(f"mirror-confirm: git push to {self.mirror.url} exited 0 but the mirror could not be "
                              "read back (see the mirror-confirm step); the mirror may already hold the fed refs. "
                              f"Re-check with: {quote_argv(self.read_command())}")
        for ref in self.refs:
            ref.new = held.get(ref.ref)
        wrong = [r for r in self.refs if r.pushed and r.new != r.requested]
        if wrong:
            raise VqAdminError("the mirror does not hold what was fed: "
                               + "; ".join(f"{r.ref} holds {r.new}, fed {r.requested}" for r in wrong))

    # -- helpers ------------------------------------------------------------------------

    def _read(self, step: str) -> dict[str, str] | None:
        result = self.run(step, self.local, self.read_command(), self.git_env, 600.0, **self.mirror.git_values)
        return parse_ls_remote(result.text(), [r.ref for r in self.refs]) if result.ok else None

    def _nothing_changed(self, outcome: str) -> None:
        for ref in self.refs:
            ref.new = ref.old
        self._not_fed(outcome)

    def _not_fed(self, outcome: str) -> None:
        """Nothing was pushed, or git applied nothing: the lane's pair is not fed (unless left drifted)."""
        if self.lane_branch != LANE_LEFT:
            self.lane_branch = LANE_NOT_FED
        self.push["outcome"] = outcome

    def _refused_by_git(self, rejected: dict[str, str], held: dict[str, str] | None) -> NoReturn:
        """git refused the atomic push, so nothing changed; a moved mirror is the same refusal as before the push."""
        moved = [ref for ref, summary in rejected.items() if any(w in summary for w in MOVED_REASONS)]
        for ref in self.refs:  # (unread: ``new`` stays None)
            ref.new = (held or {}).get(ref.ref)
        if not moved:
            self._not_fed("rejected by the mirror; nothing changed (atomic)")
            raise VqAdminError(f"mirror-feed: the mirror {self.mirror.url} rejected the push: "
                               + "; ".join(f"{ref} {summary}" for ref, summary in rejected.items())
                               + "; nothing changed (the push is atomic)")
        offending = []
        for ref in self.refs:
            if ref.ref in moved:
                ref.action, ref.reason = "refuse", RACED.format(why=git_reason(rejected[ref.ref]))
                now = held.get(ref.ref) if held is not None else "(not readable after the push)"
                offending.append(replace(ref, old=now))  # the message names what the mirror holds now
        self._not_fed("rejected by git: the mirror moved after the read; nothing changed (atomic)")
        raise Refused(refusal_text(self.mirror, offending, program=self.program, host=self.host))

    def to_receipt(self) -> dict[str, object]:
        """The receipt's ``mirror`` object."""
        return {
            "mirror": self.mirror.path,
            "where": self.mirror.where,
            "url": self.mirror.url,
            "preparer_reads": self.preparer_reads,
            "source_ref": self.source_ref,
            "lane": self.lane,
            "lane_branch": self.lane_branch,
            "refs": [r.to_dict() for r in self.refs],
            "push": dict(self.push),
        }
