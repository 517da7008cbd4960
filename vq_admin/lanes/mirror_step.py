"""The push-fed source mirror feed and the site preparer, as runtime-lane steps.

With ``feed_source_mirror`` set, the plan gains, after the read-only
pre-verify and before anything is staged:

* ``mirror-probe``   (login host)  ``git -C MIRROR rev-parse --is-bare-repository``
* ``mirror-symrefs`` (login host)  ``git -C MIRROR symbolic-ref -q <ref>``, run once for each ref of
  the set (any symbolic one refuses the feed, 77)
* ``mirror-read``    (driver)      ``git -C SOURCE_REPO ls-remote --refs -- URL REFS...``
* ``mirror-feed``    (driver)      ``git -C SOURCE_REPO push --atomic --porcelain ... -- URL PIN:REF
  [<lane branch pair>]... TAG:REF...`` (the list slot filled with the branch pair's refspecs, or nothing
  when the pair is left drifted)
* ``mirror-confirm`` (driver)      the same ls-remote, read back after the push
* ``prepare``        (login host)  ``PREPARE_COMMAND... --source-ref REF --program P --expected-sha SHA``
  (only with ``prepare_command``)

``REF`` is ``refs/heads/<lane>`` with ``preparer_reads = "lane"`` (the
default) and ``refs/vq/pins/<sha>`` with ``"pin"``.  A refusal of the feed
(77), a failed feed or preparer (1) and an unresolved push or an
interrupted preparer (3) end the run before anything is staged.  The feed
hands its runner each command as it planned it: a command that is not its
step's plan is a defect, refused before it runs.
"""

from __future__ import annotations

from ..source.mirror import FeedUnknown
from ..source.mirror_feed import Feed, Runner
from ..report.outcome import Interrupted, VqAdminError
from ..plan import SlotError, SlotValue, execute
from ..report.sections import Interruption, Mirror, Readback
from ..ssh.transport import RunResult, Transport, quote_argv
from .conclude import rerun_command
from .runtime_step import RuntimeStep


class MirrorFeed(RuntimeStep):
    """The feed and the preparer of one runtime update, built from the step's inputs; it keeps the
    feed it planned until it runs (no per-run state outside it)."""

    feed: Feed | None = None

    def prepare_argv(self, source_ref: str) -> list[str]:
        """``PREPARE_COMMAND words --source-ref REF --program P --expected-sha SHA``."""
        assert self.profile.prepare_command is not None
        return [*self.profile.prepare_command, "--source-ref", source_ref,
                "--program", self.profile.program, "--expected-sha", self.sha]

    def plan(self) -> None:
        """Add the mirror steps (and the preparer) to the plan when the profile feeds a mirror."""
        p = self.profile
        assert p.feed_source_mirror is not None  # planned only for a fed mirror
        login = self.ctx.login(self.host)
        feed = Feed(login=login, path=p.feed_source_mirror, repo=p.source_repo, sha=self.sha, lane=p.lane,
                    preparer_reads=p.preparer_reads, program=p.program, host=self.host.name,
                    timeout=p.timeout_seconds, run=self._recorder(), ssh_key=f"hosts.{self.host.name}.ssh")
        self.feed = feed
        steps, where = self.receipt.plan, feed.mirror.where
        argv, env = feed.probe_command()
        steps.add("mirror-probe", login.where, argv,
                  f"read-only: {p.feed_source_mirror} must already be a bare repository on {where}", env)
        argv, env = feed.symref_command()
        steps.add("mirror-symrefs", login.where, argv,
                  "read-only, once per ref of the set: none of them may be a symbolic ref on the mirror ("
                  + ", ".join(r.ref for r in feed.refs) + ")", env)
        steps.add("mirror-read", "local", feed.read_command(),
                  "read the mirror's values of exactly the pin ref, the lane's branch pair and the tags at the pin",
                  feed.git_env)
        steps.add("mirror-feed", "local", feed.push_command(),
                  "one atomic, unforced push of those refs (a drifted branch pair is left out when the preparer "
                  "reads the pin)", feed.git_env)
        steps.add("mirror-confirm", "local", feed.read_command(), "read back: the mirror holds what was fed",
                  feed.git_env)
        if p.prepare_command is not None:
            steps.add("prepare", login.where, self.prepare_argv(feed.source_ref),
                      f"site preparer (preparer_reads = \"{p.preparer_reads}\"): reads {feed.source_ref}")
        self.receipt.mirror = Mirror.from_value(feed.to_receipt(), "mirror")

    def run(self) -> None:
        """Feed the mirror, then run the preparer; both before the deploy step."""
        feed, ctx = self.feed, self.ctx
        assert feed is not None  # planned
        ctx.narrate(f"feeding the source mirror {feed.mirror.path} on {feed.mirror.where} with {self.sha} "
                    f"(lane {feed.lane}, preparer reads {feed.source_ref})")
        try:
            feed.feed()
        except FeedUnknown as exc:
            self._record(feed)
            self.receipt.readback = Readback(
                read=f"git ls-remote of the fed refs on {feed.mirror.url}",
                proven=False,
                reason=exc.message,
                stage="no source stage was created",
                build="no build was started",
                next_command=rerun_command(self.ctx, self.receipt),
                advice="rerunning reads the mirror first: a feed that did apply shows as unchanged refs",
            )
            self.stage.reclaim(success=False)
            raise
        except VqAdminError:
            self._record(feed)
            cut = [s for s in self.receipt.plan.steps if s.name.startswith("mirror-") and s.status == "interrupted"]
            if cut:  # e.g. mirror-probe or mirror-read cut off: failed is honest (nothing pushed), and said so
                self.receipt.interruption = Interruption(step=cut[-1].name, transport=cut[-1].detail,
                                                         installed="nothing", stage="no source stage was created")
            self.stage.reclaim(success=False)
            raise
        self._record(feed)
        changed = [r.ref for r in feed.refs if r.action in ("create", "fast-forward")]
        ctx.narrate(f"mirror fed: {', '.join(changed) if changed else 'nothing to change'} "
                    f"(lane branch pair: {feed.lane_branch})")
        if self.receipt.plan.has("prepare"):
            self._prepare(feed)

    def _recorder(self) -> Runner:
        """A feed runner that runs each command as its plan step (slots filled) and records it there."""
        def run_step(name: str, transport: Transport, argv: list[str], env: dict[str, str],
                     timeout: float, **values: SlotValue) -> RunResult:
            step = self.receipt.plan.get(name)
            if step.planned_argv != argv or step.env != env:
                raise SlotError(f"{name}: the mirror feed asked for a command that is not its planned step; "
                                "the step was not run")
            result = execute(step, transport, timeout=timeout, values=values)
            if name == "mirror-symrefs" and result.interrupted is None and result.exit_code == 1:
                step.status, step.detail = "ok", None  # git symbolic-ref -q: 1 is "not a symbolic ref", the good answer
            return result
        return run_step

    def _record(self, feed: Feed) -> None:
        self.receipt.mirror = Mirror.from_value(feed.to_receipt(), "mirror")
        for note in feed.notes:
            if note not in self.receipt.notes:
                self.receipt.notes.append(note)
                self.ctx.narrate(note)

    def _prepare(self, feed: Feed) -> None:
        """The site preparer, on the login host, reading exactly ``feed.source_ref``."""
        step = self.receipt.plan.get("prepare")
        self.ctx.narrate(f"preparing on {step.where}: {quote_argv(step.planned_argv)}")
        # the planned prepare_argv(feed.source_ref)
        result = execute(step, self.ctx.login(self.host), timeout=self.profile.timeout_seconds)
        if result.interrupted:
            self.receipt.readback = Readback(
                read=(f"the mirror feed was confirmed by read-back; the preparer's end could not be read "
                      f"({result.describe()})"),
                proven=False,
                preparer=f"the site preparer may still be running on {step.where}",
                stage="no source stage was created",
                build="no build was started",
                next_command=rerun_command(self.ctx, self.receipt),
                advice="rerun the update once the preparer has finished; the feed is already in place",
            )
            raise Interrupted(f"prepare: {result.describe()}; the preparer may still be running on {step.where}; "
                              f"nothing was staged or built; rerun the update once it has finished")
        if result.exit_code != 0:
            self.stage.reclaim(success=False)
            tail = " | ".join(result.error_text().splitlines()[-3:])
            raise VqAdminError(f"prepare: the preparer exited {result.exit_code} on {step.where}"
                               + (f": {tail}" if tail else ""))
