"""The push-fed source mirror feed and the site preparer, as runtime-lane steps.

With ``feed_source_mirror`` set, the plan gains, after the read-only
pre-verify and before anything is staged:

* ``mirror-probe``   (login host)  ``git -C MIRROR rev-parse --is-bare-repository``
* ``mirror-symrefs`` (login host)  ``git -C MIRROR symbolic-ref -q REF`` for each ref of the set
  (any symbolic one refuses the feed, 77)
* ``mirror-read``    (driver)      ``git -C SOURCE_REPO ls-remote --refs -- URL REFS...``
* ``mirror-feed``    (driver)      ``git -C SOURCE_REPO push --atomic --porcelain ... -- URL OBJ:REF...``
* ``mirror-confirm`` (driver)      the same ls-remote, read back after the push
* ``prepare``        (login host)  ``PREPARE_COMMAND... --source-ref REF --program P --expected-sha SHA``
  (only with ``prepare_command``)

``REF`` is ``refs/heads/<lane>`` with ``preparer_reads = "lane"`` (the
default) and ``refs/vq/pins/<sha>`` with ``"pin"``.  A refusal of the feed
(77), a failed feed or preparer (1) and an unresolved push or an
interrupted preparer (3) end the run before anything is staged.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Callable

from ..mirror import FeedUnknown, probe_env
from ..mirror_feed import Feed
from ..outcome import Interrupted, VqAdminError
from ..plan import execute
from ..transport import RunResult, Transport, quote_argv

if TYPE_CHECKING:
    from .runtime import RuntimeUpdate

#: The feed planned for each update (kept off the RuntimeUpdate object itself).
_FEEDS: "weakref.WeakKeyDictionary[RuntimeUpdate, Feed]" = weakref.WeakKeyDictionary()


def prepare_argv(update: "RuntimeUpdate", source_ref: str) -> list[str]:
    """``PREPARE_COMMAND words --source-ref REF --program P --expected-sha SHA``."""
    assert update.profile.prepare_command is not None
    return [*update.profile.prepare_command, "--source-ref", source_ref,
            "--program", update.profile.program, "--expected-sha", update.sha]


def plan(update: "RuntimeUpdate") -> None:
    """Add the mirror steps (and the preparer) to the plan when the profile feeds a mirror."""
    p = update.profile
    if p.feed_source_mirror is None:
        return
    assert p.source_repo is not None
    login = update.ctx.login(update.host)
    feed = Feed(login=login, path=p.feed_source_mirror, repo=p.source_repo, sha=update.sha, lane=p.lane,
                preparer_reads=p.preparer_reads, program=p.program, host=update.host.name,
                timeout=p.timeout_seconds, run=_recorder(update), ssh_key=f"hosts.{update.host.name}.ssh")
    _FEEDS[update] = feed
    steps, where = update.receipt.plan, feed.mirror.where
    argv, env = feed.probe_command()
    steps.add("mirror-probe", login.where, argv,
              f"read-only: {p.feed_source_mirror} must already be a bare repository on {where}", env)
    steps.add("mirror-symrefs", login.where, feed.symref_commands()[0],
              "read-only, once per ref of the set: none of them may be a symbolic ref on the mirror ("
              + ", ".join(r.ref for r in feed.refs) + ")", probe_env(p.feed_source_mirror))
    steps.add("mirror-read", "local", feed.read_command(),
              "read the mirror's values of exactly the pin ref, the lane's branch pair and the tags at the pin",
              feed.git_env)
    steps.add("mirror-feed", "local", feed.push_command(),
              "one atomic, unforced push of those refs (a drifted branch pair is left out when the preparer "
              "reads the pin)", feed.git_env)
    steps.add("mirror-confirm", "local", feed.read_command(), "read back: the mirror holds what was fed",
              feed.git_env)
    if p.prepare_command is not None:
        steps.add("prepare", login.where, prepare_argv(update, feed.source_ref),
                  f"site preparer (preparer_reads = \"{p.preparer_reads}\"): reads {feed.source_ref}")
    update.receipt.mirror = feed.to_receipt()


def run(update: "RuntimeUpdate") -> None:
    """Feed the mirror, then run the preparer; both before the deploy step."""
    feed = _FEEDS.get(update)
    if feed is None:
        return
    ctx = update.ctx
    ctx.narrate(f"feeding the source mirror {feed.mirror.path} on {feed.mirror.where} with {update.sha} "
                f"(lane {feed.lane}, preparer reads {feed.source_ref})")
    try:
        feed.feed()
    except FeedUnknown as exc:
        _record(update, feed)
        update.receipt.readback = {
            "read": f"git ls-remote of the fed refs on {feed.mirror.url}",
            "proven": False,
            "reason": exc.message,
            "stage": "no source stage was created",
            "build": "no build was started",
            "next_command": quote_argv(["vq", "admin", "update", update.profile.program, update.host.name,
                                        "--expected-sha", update.sha]),
            "advice": "rerunning reads the mirror first: a feed that did apply shows as unchanged refs",
        }
        update.reclaim(success=False)
        raise
    except VqAdminError:
        _record(update, feed)
        cut = [s for s in update.receipt.plan.steps if s.name.startswith("mirror-") and s.status == "interrupted"]
        if cut:  # e.g. mirror-probe or mirror-read cut off: failed is honest (nothing pushed), and said so
            update.receipt.interruption = {"step": cut[-1].name, "transport": cut[-1].detail,
                                                    "installed": "nothing", "stage": "no source stage was created"}
        update.reclaim(success=False)
        raise
    _record(update, feed)
    changed = [r.ref for r in feed.refs if r.action in ("create", "fast-forward")]
    ctx.narrate(f"mirror fed: {', '.join(changed) if changed else 'nothing to change'} "
                f"(lane branch pair: {feed.lane_branch})")
    if update.receipt.plan.has("prepare"):
        _prepare(update, feed)


def _recorder(update: "RuntimeUpdate") -> Callable[[str, Transport, list[str], dict[str, str], float], RunResult]:
    """A feed runner that records every command into its plan step."""
    def run_step(name: str, transport: Transport, argv: list[str], env: dict[str, str], timeout: float) -> RunResult:
        step = update.receipt.plan.get(name)
        result = execute(step, transport, argv, timeout=timeout, env=env)
        if name == "mirror-symrefs" and result.interrupted is None and result.exit_code == 1:
            step.status, step.detail = "ok", None  # git symbolic-ref -q: 1 is "not a symbolic ref", the good answer
        return result
    return run_step


def _record(update: "RuntimeUpdate", feed: Feed) -> None:
    update.receipt.mirror = feed.to_receipt()
    if feed.notes:
        notes = update.receipt.notes
        for note in feed.notes:
            if note not in notes:
                notes.append(note)
                update.ctx.narrate(note)


def _prepare(update: "RuntimeUpdate", feed: Feed) -> None:
    """The site preparer, on the login host, reading exactly ``feed.source_ref``."""
    step = update.receipt.plan.get("prepare")
    argv = prepare_argv(update, feed.source_ref)
    update.ctx.narrate(f"preparing on {step.where}: {quote_argv(argv)}")
    result = execute(step, update.ctx.login(update.host), argv, timeout=update.profile.timeout_seconds)
    if result.interrupted:
        update.receipt.readback = {
            "read": (f"the mirror feed was confirmed by read-back; the preparer's end could not be read "
                     f"({result.describe()})"),
            "proven": False,
            "preparer": f"the site preparer may still be running on {step.where}",
            "stage": "no source stage was created",
            "build": "no build was started",
            "next_command": quote_argv(["vq", "admin", "update", update.profile.program, update.host.name,
                                        "--expected-sha", update.sha]),
            "advice": "rerun the update once the preparer has finished; the feed is already in place",
        }
        raise Interrupted(f"prepare: {result.describe()}; the preparer may still be running on {step.where}; "
                          f"nothing was staged or built; rerun the update once it has finished")
    if result.exit_code != 0:
        update.reclaim(success=False)
        tail = " | ".join(result.error_text().splitlines()[-3:])
        raise VqAdminError(f"prepare: the preparer exited {result.exit_code} on {step.where}"
                           + (f": {tail}" if tail else ""))
