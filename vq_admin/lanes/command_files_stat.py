"""Command files on a remote host, checked without the agent: for the helper lane.

The runtime lane asks the agent on each host (``check-paths``,
:mod:`.command_files`).  The helper lane cannot: it installs and replaces
that agent, which is itself one of the command files to judge -- asking it
whether it can be trusted would run it first.  So before the helper lane runs
anything on an ssh host, two planned steps read the facts with two coreutils
programs named by absolute path, and the driver applies the secure-path rule
(:func:`vq_admin.core.securepath.chain_problem`) to them:

1. ``check-commands``: ``/usr/bin/realpath --zero --canonicalize-missing --
   WORD...``: what each absolute word resolves to on that host;
2. ``check-levels``: ``/usr/bin/stat --dereference --printf=... -- /proc/self
   [<level>]...``: the owner and mode of each word's real file and of every
   directory above the word and above its real file, the list slot filled
   from the first step's answer; ``/proc/self`` is the ``stat`` process
   itself, whose owner is the remote account (the user the rule trusts
   besides root).

(``check-commands-2`` and ``check-levels-2`` for a second host.)  Both run
their planned argv with no shell, read nothing but inode metadata and write
nothing.  A level that does not exist is judged as the agent judges it (a missing word
passes only when no other user could create it).  Anything the driver
cannot read back (a program missing, output it cannot parse, ``/proc/self``
absent) refuses the run (77): the check fails closed.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from typing import Callable, Sequence

from vq_admin_hookspecs import Slot

from ..core import securepath
from ..report.outcome import Refused, VqAdminError
from ..report.sections import AgentChecked
from ..plan import Plan, SlotError, SlotValue, Step, execute
from ..ssh.transport import RunResult, Transport
from .command_files import CHECK_TIMEOUT, PURPOSE, Place, gather, keys_of, step_name

REALPATH = "/usr/bin/realpath"
STAT = "/usr/bin/stat"
SELF = "/proc/self"
#: name, uid, raw mode (hex), user name: NUL-terminated fields (names hold no NUL).
STAT_FORMAT = r"%n\0%u\0%f\0%U\0"
_DIGITS = re.compile(r"\A[0-9]{1,10}\Z")
_HEX = re.compile(r"\A[0-9a-f]{1,8}\Z")


@dataclass(frozen=True)
class Level:
    """One path's owner and mode as ``stat`` reported them on the remote host."""

    st_uid: int
    st_mode: int
    owner: str


def realpath_argv(words: list[str]) -> list[str]:
    return [REALPATH, "--zero", "--canonicalize-missing", "--", *words]


#: The ``check-levels`` step's list slot: every level the ``check-commands`` answer named.
LEVELS = Slot("levels", label="level", many=True)


def stat_argv(paths: list[str] | None = None) -> list[str]:
    """``stat`` of ``/proc/self`` and *paths*; without *paths*, the planned argv with its list slot."""
    return [STAT, "--dereference", f"--printf={STAT_FORMAT}", "--", SELF, *([LEVELS] if paths is None else paths)]


def unique_words(words: list[tuple[str, str]]) -> list[str]:
    """Every absolute word once, normalised, plus the two programs this check runs there."""
    return list(dict.fromkeys(os.path.normpath(w) for w in [*(w for _k, w in words), REALPATH, STAT]))


def levels_to_read(words: list[str], reals: list[str]) -> list[str]:
    """Each real file, and every directory above each word and above its real file."""
    return list(dict.fromkeys(path for word, real in zip(words, reals, strict=True)
                              for path in [real, *securepath.ancestors(word), *securepath.ancestors(real)]))


def parse_realpaths(result: RunResult, count: int) -> list[str] | None:
    """The *count* NUL-terminated absolute paths ``realpath`` printed, or ``None``."""
    if not result.ok or result.stdout_truncated:
        return None
    parts = result.stdout.split(b"\0")
    if len(parts) != count + 1 or parts[-1] != b"":
        return None
    reals = [os.fsdecode(p) for p in parts[:-1]]
    return reals if all(r.startswith("/") and os.path.normpath(r) == r for r in reals) else None


def parse_levels(result: RunResult, asked: list[str]) -> dict[str, Level] | None:
    """``{path: Level}`` for every path ``stat`` could read (a missing path is simply absent), or
    ``None`` when the output is not what was asked for."""
    if result.stdout_truncated or result.exit_code not in (0, 1):  # 1: some path does not exist
        return None
    parts = result.stdout.split(b"\0")
    if len(parts) % 4 != 1 or parts[-1] != b"":
        return None
    found: dict[str, Level] = {}
    for i in range(0, len(parts) - 1, 4):
        name, uid, mode, owner = (os.fsdecode(p) for p in parts[i:i + 4])
        if name not in asked or name in found or not _DIGITS.match(uid) or not _HEX.match(mode):
            return None
        found[name] = Level(int(uid), int(mode, 16), owner if owner != "UNKNOWN" else f"uid {uid}")
    return found


def problems(words: list[str], reals: list[str], levels: dict[str, Level]) -> list[tuple[str, str]]:
    """``[(word, problem), ...]`` by the secure-path rule, judged for the remote account."""
    me = levels[SELF].st_uid
    names = {lv.st_uid: f"{lv.owner} (uid {lv.st_uid})" if not lv.owner.startswith("uid ") else lv.owner
             for lv in levels.values()}

    def stat_of(path: str) -> os.stat_result:
        level = levels.get(path)
        if level is None:
            raise FileNotFoundError(path)
        return os.stat_result((level.st_mode, 0, 0, 0, level.st_uid, 0, 0, 0, 0, 0))

    def owner_name(uid: int) -> str:
        return names.get(uid, f"uid {uid}")

    found: list[tuple[str, str]] = []
    for word, real in zip(words, reals, strict=True):
        problem = securepath.chain_problem(word, real, stat_of, what="command file", missing_ok=True, me=me,
                                           owner_name=owner_name)
        if problem is None and real not in levels:
            problem = securepath.creatable_problem(real, stat_of)
        if problem:
            found.append((word, problem))
    return found


def plan_places(steps: Plan, places: list[Place]) -> None:
    """Two steps per ssh host of *places*: ``check-commands`` (``realpath`` of the words) and
    ``check-levels`` (``stat`` of each level, a list slot filled from the first one's answer)."""
    for index, (transport, words) in enumerate(places):
        steps.add(step_name(index), transport.where, realpath_argv(unique_words(words)),
                  PURPOSE + "; first, what each word resolves to (read by the driver, not the agent)")
        steps.add(step_name(index, "check-levels"), transport.where, stat_argv(),
                  PURPOSE + "; then the owner and mode of each level (read by the driver, not the agent)")


def run_places(steps: Plan, places: list[Place]) -> None:
    """Run the steps :func:`plan_places` added; :class:`Refused` (77) before anything runs on a host
    whose command files fail the rule, or whose facts cannot be read back."""
    for index, (transport, words) in enumerate(places):
        check_place(steps.get(step_name(index)), steps.get(step_name(index, "check-levels")), transport, words)


def _call(step: Step, transport: Transport, values: dict[str, SlotValue]) -> RunResult:
    result = execute(step, transport, timeout=CHECK_TIMEOUT, values=values)
    if result.interrupted:
        raise VqAdminError(f"{step.name}: {result.describe()}; no configured command was run: this "
                           "run changed nothing")
    return result


def check_place(resolve: Step, stat_step: Step, transport: Transport, words: list[tuple[str, str]]) -> None:
    """Run the planned *resolve* (``realpath``) and *stat_step* (``stat``) steps of one host and judge
    *words* by their answers."""
    where = transport.where
    paths = unique_words(words)
    if resolve.planned_argv != realpath_argv(paths) or stat_step.planned_argv != stat_argv():
        raise SlotError(f"{resolve.name}: the planned check is not the check of {where}'s command files; "
                        "the step was not run")
    done = _call(resolve, transport, {})
    reals = parse_realpaths(done, len(paths))
    if reals is None:
        raise _unreadable(resolve, where, done, REALPATH)
    asked = levels_to_read(paths, reals)
    done = _call(stat_step, transport, {LEVELS.name: asked})
    levels = parse_levels(done, [SELF, *asked])
    if levels is None or SELF not in levels or not stat.S_ISDIR(levels[SELF].st_mode):
        raise _unreadable(stat_step, where, done, STAT)
    # stat exits 1 when a level is missing: that is judged by the rule below, not a failure of the step
    # (the step keeps stat's own exit status, beside the argv that gave it)
    stat_step.status = "ok"
    stat_step.detail = ("a level does not exist (stat exit status 1); judged by the rule"
                        if done.exit_code == 1 else None)
    found = problems(paths, reals, levels)
    if found:
        stat_step.status = "failed"
        named = [(key, os.path.normpath(word)) for key, word in words]
        lines = [f"{', '.join(keys_of(named, word) if word not in (REALPATH, STAT) else ['the check itself'])}: "
                 f"{problem}" for word, problem in found]
        stat_step.detail = "; ".join(lines)[:2000]
        raise Refused(f"refused on {where}: {'; '.join(lines)}; no configured command was run there")


def _unreadable(step: Step, where: str, result: RunResult, program: str) -> Refused:
    step.status = "failed"
    tail = result.error_text().strip()[-300:]
    return Refused(f"{step.name}: the command files on {where} could not be checked: {program} "
                   f"{result.describe()}{': ' + tail if tail else ''} (vq-admin reads owners and modes there with "
                   f"{REALPATH} and {STAT}, GNU coreutils); no configured command was run")


def check_agent_before_lease(transport: Transport, host_name: str, agent: Sequence[str],
                             checked: Callable[[AgentChecked], None]) -> None:
    """The helper lane's lease runs the agent on the login host before the lane's own steps: judge
    the agent's words there first, so it never runs unjudged.  The two steps are planned and run as
    the lane's own check is, named ``lease-check-commands`` and ``lease-check-levels`` (their own
    failpoints), and given to *checked* (for the lease's record), not to the lane's steps."""
    places = gather([(transport, f"hosts.{host_name}.agent", agent)])
    if not places:  # not reached over ssh: the driver checks a local command itself, when it runs it
        return
    ((login, words),) = places
    steps = Plan()
    plan_places(steps, [(login, words)])
    for step in steps.steps:
        step.name = f"lease-{step.name}"
    resolve, levels = steps.steps
    try:
        check_place(resolve, levels, login, words)
    finally:
        last = levels if levels.status != "planned" else resolve
        checked(AgentChecked(argv=last.argv, status=last.status, detail=last.detail, steps=steps.to_list()))
