"""The push-fed source mirror: one unforced, atomic feed of the exact pin.

A build node that cannot reach the source repository reads a bare mirror on
the login host instead; vq-admin feeds that mirror by push from the driver's
``source_repo``.  The feed (docs/operations.md, "Feeding the source mirror"):

1. *probe*, read-only, on the login host: the mirror path is an existing bare
   repository (``git -C PATH rev-parse --is-bare-repository`` with
   ``GIT_CEILING_DIRECTORIES`` set to its parent, so a directory inside some
   other repository is not mistaken for one).  Anything else is refused (77)
   with the command that creates a proper mirror; vq-admin never creates or
   repairs it;
2. *read* the mirror's values of exactly the refs of the set
   (``git ls-remote``): ``refs/vq/pins/<sha>``, ``refs/heads/<lane>``,
   ``refs/remotes/origin/<lane>`` and ``refs/tags/<t>`` for every tag of the
   driver's checkout that points at ``<sha>`` (light, or annotated: then the
   tag object itself is fed);
3. *decide* per ref: create, unchanged, fast-forward, or refuse.  Any refusal
   (a branch the new commit does not descend from, a tag or pin ref at another
   object) refuses the whole feed before any push, with :data:`REFUSAL`;
   with ``preparer_reads = "pin"`` a drifted branch pair is instead left
   exactly as it is;
4. *push*: one ``git push --atomic --porcelain`` of ``<object>:<ref>``
   refspecs, never ``+``, never a force or mirror option (:func:`push_argv`).
   git's own refusal (the mirror moved after the read) is the same refusal;
5. *confirm*: read the refs again; the mirror must hold what was pushed.

Only the refs of the set are ever named, so every other ref of the mirror
stays byte-identical.  This module knows nothing of lanes; the runtime lane
wires it in through :mod:`vq_admin.lanes.mirror_step`.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from vq_admin_hookspecs import Slot

from ..core.failpoints import failpoint
from ..core.identifiers import SHA_RE
from ..config import ConfigError
from ..report.outcome import Outcome, VqAdminError
from . import GIT_ENV, RECEIVE_PACK, _answered, git, run_git
from ..ssh.transport import RunResult, SshTransport, Transport, quote_argv, run_local_argv

PIN_PREFIX = "refs/vq/pins/"
LOCAL_GIT_TIMEOUT = 300.0
#: Options a feed's push never carries (asserted by tests on every argv built here).
FORBIDDEN_PUSH_OPTIONS = ("-f", "--force", "--force-with-lease", "--force-if-includes", "--mirror",
                          "--prune", "--delete", "-d", "--all", "--tags", "--follow-tags")

#: The one refusal text; one REFUSAL_REF line per offending ref fills ``{refs}``.
REFUSAL = (
    "refused: feeding the source mirror {mirror} on {where} would need a forced update, and vq-admin "
    "never forces the mirror; nothing was pushed.\n"
    "{refs}"
    "Two ways out: deploy the commit the mirror carries (vq admin update {program} {host} "
    "--expected-sha <the commit the mirror holds>), or have the mirror's owner move that branch (or tag) "
    "back deliberately; then run the update again."
)
REFUSAL_REF = "  {ref}: the mirror holds {held}, requested {requested} ({reason})\n"
#: Reasons, a closed set.
ADVANCED = "the branch has advanced past the requested commit; feeding it would rewind the mirror"
DIVERGED = "the requested commit does not descend from the commit the branch holds"
UNSEEN = "the branch holds a commit the driver's checkout has never seen"
NOT_A_COMMIT = "the ref holds a {type} object, not a commit"
TAG_ELSEWHERE = "the tag exists at another object; tags are never moved"
PIN_ELSEWHERE = "the pin ref exists at another commit; pin refs are never moved"
#: The kinds of ref a feed never moves once they exist, and the reason a moved one gives.
NEVER_MOVED = {"tag": TAG_ELSEWHERE, "pin": PIN_ELSEWHERE}
RACED = "git refused the push ({why}): the mirror changed after vq-admin read it"

#: A ref of the set that is a symbolic ref on the mirror (one line per such ref fills ``{refs}``).
SYMREF_REFUSAL = (
    "refused: in the source mirror {mirror} on {where}, {refs}; a push to a symbolic ref would move its "
    "target, a ref outside the feed, so vq-admin never feeds one; nothing was pushed. The mirror's owner "
    "replaces the symbolic ref with a plain one (git -C {quoted} symbolic-ref --delete REF), then the update "
    "runs again."
)

#: Probe refusals: missing, plain directory, working checkout.
PROBE_REFUSAL = (
    "refused: the source mirror {mirror} on {where} {problem}. vq-admin feeds only an existing bare "
    "repository and never creates or repairs one; nothing was pushed. To create it, the mirror's owner "
    "runs on {where}: git init --bare {quoted}   (the next update then feeds it)."
)
MISSING = "does not exist (or is not a directory)"
NOT_A_REPOSITORY = "is a directory but not a git repository"
WORKING_CHECKOUT = "is a working checkout, not a bare repository"


class FeedUnknown(VqAdminError):
    """The push's transport failed and read-back could not tell whether it applied (exit 3)."""

    outcome = Outcome.UNKNOWN


@dataclass
class FeedRef:
    """One ref of the set: what the driver requests and what the mirror does with it."""

    ref: str
    kind: str                  # pin | branch | tag
    requested: str             # object name the feed pushes
    old: str | None = None     # the mirror's value when read (None: absent)
    action: str = "planned"    # create | unchanged | fast-forward | refuse | left-drifted
    reason: str | None = None
    new: str | None = None     # the mirror's value after the feed

    @property
    def pushed(self) -> bool:
        return self.action in ("create", "unchanged", "fast-forward")

    def to_dict(self) -> dict[str, str | None]:
        return {"ref": self.ref, "kind": self.kind, "old": self.old, "requested": self.requested,
                "new": self.new, "action": self.action, "reason": self.reason}


@dataclass(frozen=True)
class Mirror:
    """Where the mirror is and how git on the driver reaches it."""

    path: str                  # on the login host
    where: str                 # the login host (ssh destination, or "local")
    url: str                   # what git on the driver fetches from / pushes to
    git_env: Mapping[str, str] = field(default_factory=dict)
    #: the values of the slots in ``git_env`` (the run's ssh control directory)
    git_values: Mapping[str, str] = field(default_factory=dict)


#: The run's ssh control directory inside ``GIT_SSH_COMMAND``: each run (a dry run too) has its own
#: (``/tmp/vqssh-<pid>-*``), so the plan holds this slot and a git step fills it when it runs.
CONTROL_DIR = "ssh_control_dir"
#: A control directory that can stand inside the single-quoted ControlPath word.
CONTROL_DIR_RE = re.compile(r"\A/[^'\s\0]*\Z")


def git_ssh_command(transport: SshTransport) -> tuple[str, dict[str, str]]:
    """``GIT_SSH_COMMAND`` for *transport*: :meth:`SshTransport.ssh_base` quoted for the shell git
    hands it to, and the values of its slots.  With a control directory, its ``ControlPath`` word is
    single-quoted and the directory in it is the :data:`CONTROL_DIR` slot."""
    words = transport.ssh_base()
    control = transport.control_dir
    if not control:
        return quote_argv(words), {}
    if not CONTROL_DIR_RE.match(control):
        raise VqAdminError(f"the ssh control directory {control!r} cannot be quoted into GIT_SSH_COMMAND")
    at = words.index(f"ControlPath={control}/%C")  # followed by its ControlPersist option
    before, after = quote_argv(words[:at]), quote_argv(words[at + 1:])
    command = Slot(CONTROL_DIR, label="ssh control dir", prefix=f"{before} 'ControlPath=", suffix=f"/%C' {after}")
    return command, {CONTROL_DIR: control}


def mirror_for(transport: Transport, path: str, ssh_key: str = "ssh") -> Mirror:
    """The mirror *path* on the host *transport* reaches, with vq-admin's own ssh settings: over ssh, git
    runs exactly :meth:`SshTransport.ssh_base` (:func:`git_ssh_command`) with the scp-form url ``DEST:PATH``;
    a local host's url is the plain path.  A destination git cannot put in that url (one with ``:`` or ``/``)
    is a configuration error naming *ssh_key* (exit 2)."""
    if not path.startswith("/"):
        raise VqAdminError(f"feed_source_mirror {path!r} is not an absolute path")
    if not isinstance(transport, SshTransport):
        return Mirror(path=path, where=transport.where, url=path, git_env=dict(GIT_ENV))
    dest = transport.destination
    if ":" in dest or "/" in dest:
        raise ConfigError(ssh_key, f"{dest!r} contains ':' or '/', which git cannot use in the url of "
                                   "feed_source_mirror; give the host an alias in the ssh configuration")
    # LC_ALL=C: git's own words on a lost connection are read (mirror_feed.lost_mid_push)
    command, values = git_ssh_command(transport)
    env = {**GIT_ENV, "GIT_SSH_COMMAND": command, "GIT_SSH_VARIANT": "ssh", "LC_ALL": "C"}
    return Mirror(path=path, where=dest, url=f"{dest}:{path}", git_env=env, git_values=values)


# -- the ref set ------------------------------------------------------------------


def ref_set(repo: str, sha: str, lane: str) -> list[FeedRef]:
    """Exactly the refs a feed of *sha* names: the pin, the lane's branch pair, the tags at *sha*."""
    refs = [FeedRef(PIN_PREFIX + sha, "pin", sha),
            FeedRef(f"refs/heads/{lane}", "branch", sha),
            FeedRef(f"refs/remotes/origin/{lane}", "branch", sha)]
    return refs + tags_at(repo, sha)


def tags_at(repo: str, sha: str) -> list[FeedRef]:
    """Every ``refs/tags/*`` of *repo* naming *sha*: a light tag, or an annotated tag object whose target it is."""
    argv = ["git", "-C", repo, "for-each-ref", f"--points-at={sha}",
            "--format=%(objectname) %(objecttype) %(*objectname) %(refname)", "refs/tags/"]
    listed = run_git(argv, timeout=LOCAL_GIT_TIMEOUT)
    if not listed.ok:
        raise VqAdminError(f"cannot list the tags at {sha} in {repo}: {listed.error_text()}")
    tags = []
    for line in listed.text().splitlines():
        words = line.split(" ")
        if len(words) != 4:  # (the pattern refs/tags/ lists tags only)
            continue
        obj, kind, target, name = words
        if (kind == "commit" and obj == sha) or (kind == "tag" and target == sha):
            tags.append(FeedRef(name, "tag", obj))
    return sorted(tags, key=lambda r: r.ref)


# -- argv ---------------------------------------------------------------------------


def probe_argv(path: str) -> list[str]:
    """Read-only, on the login host: is *path* itself a bare repository?"""
    return ["git", "-C", path, "rev-parse", "--is-bare-repository"]


def probe_env(path: str) -> dict[str, str]:
    """Stop git's repository discovery at *path* (never look in a parent) and keep its messages parseable."""
    return {**GIT_ENV, "GIT_CEILING_DIRECTORIES": posixpath.dirname(path.rstrip("/")) or "/", "LC_ALL": "C"}


#: The ref one ``mirror-symrefs`` read asks about: the step is planned once, with this slot, and
#: runs once per ref of the set with the ref filled in.
REF = Slot("ref")


def full_ref(ref: str) -> str:
    """*ref* when it is a full ref name of one word (``refs/...``); else :class:`ValueError`."""
    if not ref.startswith("refs/") or len(ref.split()) != 1:
        raise ValueError(f"not a full ref name: {ref!r}")
    return ref


def symref_argv(path: str, ref: str = REF) -> list[str]:
    """Read-only, on the login host: is *ref* a symbolic ref in the mirror (dangling ones included)?

    ``git symbolic-ref -q REF`` exits 0 printing the target when it is, 1 when
    it is not (or does not exist).  A push to a symbolic ref would update its
    target, a ref outside the set (``refs/heads/release -> refs/tags/stable``
    moves the tag), so a feed refuses any.  *ref* is a full ref name or (the
    planned step) the :data:`REF` slot.
    """
    return ["git", "-C", path, "symbolic-ref", "-q", ref if isinstance(ref, Slot) else full_ref(ref)]


def read_argv(repo: str, mirror: Mirror, refs: Sequence[FeedRef]) -> list[str]:
    """``git ls-remote`` of exactly the refs of the set (filtered to exact names by :func:`parse_ls_remote`)."""
    return ["git", "-C", repo, "ls-remote", "--refs", "--upload-pack=git-upload-pack", "--", mirror.url,
            *(r.ref for r in refs)]


#: A full ref name of one word that a refspec can carry (no ``:``, no whitespace anywhere).
PLAIN_REF_RE = re.compile(r"\Arefs/[^:\s]*\Z")


def refspec(obj: str, ref: str) -> str:
    """``OBJECT:REF`` for a full object name and a full ref name of one word (never ``+``); else :class:`ValueError`."""
    if not SHA_RE.match(obj) or not PLAIN_REF_RE.match(ref):
        raise ValueError(f"not a plain OBJECT:REF refspec: {obj!r}:{ref!r}")
    return f"{obj}:{ref}"


def push_argv(repo: str, url: str, refspecs: Sequence[tuple[str, str]]) -> list[str]:
    """The one push: atomic, porcelain, ``OBJECT:REF`` refspecs, no ``+``, no force, no tags or submodules followed.

    ``--no-verify`` keeps the driver checkout's own pre-push hook out of the feed, and the mirror
    runs :data:`~vq_admin.source.RECEIVE_PACK` (its hooks off) whatever the checkout configures.
    """
    specs = [refspec(obj, ref) for obj, ref in refspecs]
    if not specs:
        raise ValueError("a feed pushes at least the pin ref")
    return ["git", "-C", repo, "push", "--atomic", "--porcelain", "--no-follow-tags",
            "--no-recurse-submodules", "--no-verify", f"--receive-pack={RECEIVE_PACK}", "--", url, *specs]


#: The lane's branch pair in the planned push.  Only the mirror's read tells whether it is fed (two
#: refspecs) or, when the preparer reads the pin and the pair has drifted, left out (none), so the
#: plan holds this list slot and the push fills it (:func:`lane_pair_refspecs`).
LANE_PAIR = Slot("lane_refspecs", label="lane branch pair", many=True)


def push_template(repo: str, url: str, refs: Sequence[FeedRef]) -> list[str]:
    """The planned push: the pin's and the tags' refspecs (a push happens only when every one of them
    is fed) and, right after the pin's, :data:`LANE_PAIR` for the lane's branch pair; filled, the
    words are :func:`push_argv`'s for the refs :func:`feed_refspecs` names, in the same order."""
    pins = [(r.requested, r.ref) for r in refs if r.kind == "pin"]  # exactly one: ref_set's first
    tags = [(r.requested, r.ref) for r in refs if r.kind == "tag"]
    argv = push_argv(repo, url, pins + tags)
    at = argv.index("--") + 3  # after the url and the pin's refspec
    return [*argv[:at], LANE_PAIR, *argv[at:]]


def lane_pair_refspecs(refs: Sequence[FeedRef]) -> list[str]:
    """The words that fill :data:`LANE_PAIR`: the refspecs of the branch pair the push names."""
    return [refspec(obj, ref) for obj, ref in feed_refspecs([r for r in refs if r.kind == "branch"])]


def feed_refspecs(refs: Sequence[FeedRef]) -> list[tuple[str, str]]:
    """``(object, ref)`` of every ref the push names: those still planned or decided fed; never a refused
    or left-drifted one."""
    return [(r.requested, r.ref) for r in refs if r.pushed or r.action == "planned"]


def parse_ls_remote(text: str, names: Sequence[str]) -> dict[str, str]:
    """``{ref: object}`` for the exact *names* (ls-remote matches patterns by their tail)."""
    wanted, held = set(names), {}
    for line in text.splitlines():
        obj, _, name = line.partition("\t")
        if name in wanted:
            held[name] = obj.strip()
    return held


def git_reason(summary: str) -> str:
    """``non-fast-forward`` from a porcelain summary such as ``[rejected] (non-fast-forward)``."""
    found = re.search(r"\(([^()]*)\)\s*\Z", summary)
    return found.group(1) if found else summary.strip()


def parse_porcelain(text: str) -> dict[str, tuple[str, str]]:
    """``{dst ref: (flag, summary)}`` from ``git push --porcelain`` output."""
    lines = {}
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) == 3 and len(parts[0]) == 1:
            lines[parts[1].rpartition(":")[2]] = (parts[0], parts[2])
    return lines


# -- deciding -----------------------------------------------------------------------


def decide(repo: str, refs: Sequence[FeedRef], held: Mapping[str, str]) -> None:
    """Fill ``old``, ``action`` and ``reason`` of each ref from the mirror's values *held*."""
    for ref in refs:
        ref.old = held.get(ref.ref)
        ref.action, ref.reason = "create", None
        if ref.old is None:
            continue
        if ref.old == ref.requested:
            ref.action = "unchanged"
        elif ref.kind in NEVER_MOVED:
            ref.action, ref.reason = "refuse", NEVER_MOVED[ref.kind]
        else:
            ref.action, ref.reason = _branch(repo, ref.old, ref.requested)


def _branch(repo: str, old: str, new: str) -> tuple[str, str | None]:
    kind = git(repo, "cat-file", "-t", "--end-of-options", old, timeout=LOCAL_GIT_TIMEOUT)
    if not kind.ok:
        if _answered(kind, 128):  # git: no such object here
            return "refuse", UNSEEN
        raise VqAdminError(f"git cat-file -t {old} failed in {repo} ({kind.describe()}): {kind.error_text()[-300:]}")
    if kind.text().strip() != "commit":
        return "refuse", NOT_A_COMMIT.format(type=kind.text().strip())
    forward = git(repo, "merge-base", "--is-ancestor", old, new, timeout=LOCAL_GIT_TIMEOUT)
    if forward.exit_code == 0:
        return "fast-forward", None
    if forward.exit_code != 1:
        raise VqAdminError(f"git merge-base --is-ancestor {old} {new} failed in {repo}: {forward.error_text()}")
    behind = git(repo, "merge-base", "--is-ancestor", new, old, timeout=LOCAL_GIT_TIMEOUT)
    if behind.exit_code not in (0, 1):  # (an interrupted local git has no status, or a signal's: never 0 or 1)
        raise VqAdminError(f"git merge-base --is-ancestor {new} {old} failed in {repo}: {behind.describe()}")
    return "refuse", ADVANCED if behind.exit_code == 0 else DIVERGED


def refusal_text(mirror: Mirror, offending: Sequence[FeedRef], *, program: str, host: str) -> str:
    """:data:`REFUSAL` filled in, one line per offending ref."""
    lines = "".join(REFUSAL_REF.format(ref=r.ref, held=r.old or "nothing", requested=r.requested, reason=r.reason)
                    for r in offending)
    return REFUSAL.format(mirror=mirror.path, where=mirror.where, refs=lines, program=program, host=host)


def probe_refusal(mirror: Mirror, result: RunResult) -> str | None:
    """None when the probe proved a bare repository; else why the feed is refused."""
    if result.ok and result.text().strip() == "true":
        return None
    message = result.error_text()
    if result.ok and result.text().strip() == "false":
        problem = WORKING_CHECKOUT
    elif "cannot change to" in message:
        problem = MISSING
    elif "not a git repository" in message:
        problem = NOT_A_REPOSITORY
    else:
        problem = f"cannot be read as a git repository ({result.describe()}: {message[-300:]})"
    return PROBE_REFUSAL.format(mirror=mirror.path, where=mirror.where, problem=problem,
                                quoted=shlex.quote(mirror.path))


# -- the test hook --------------------------------------------------------------------


def run_test_hook(mirror: Mirror, hook: Callable[[Mirror], None] | None = None) -> None:
    """Between the read and the push: *hook*, or (tests only) the executable of the
    ``mirror-before-push`` failpoint (:mod:`vq_admin.core.failpoints`), run as
    ``HOOK MIRROR_PATH``; operators never enable it.
    """
    if hook is not None:
        hook(mirror)
        return
    path = failpoint("mirror-before-push")
    if not path:
        return
    done = run_local_argv([path, mirror.path], [path, mirror.path], "local", timeout=60)
    if not done.ok:
        raise VqAdminError(f"test hook {path} failed: {done.describe()}: {done.error_text()}")
