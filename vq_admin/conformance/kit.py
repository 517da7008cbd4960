"""The conformance sequence: one provider, commits A, B, C, a disposable root.

1. ``hooks``: runtime update and verify are implemented (install optional);
2. ``argv-shape``: the update (and install) argv keeps the given
   ``--update-script-arg`` words contiguous, in order and unchanged (a word
   with a space and an empty word included), carries the full SHA and the
   staged archive path verbatim, and is the same when asked twice;
3. deploy A (install when offered), then ``evidence-A``: the verify receipt
   passes every check of CONTRACT section 4, the launcher exists below the
   disposable root and hashes to what the receipt says;
4. deploy B, ``evidence-B``, ``separate-runtime`` (B's per-SHA release is
   not A's) and ``older-kept-after-B`` (A's release and launcher unchanged);
5. deploy C, whose selftest fails: ``failed-validation-exits-nonzero``,
   ``current-unchanged-until-validated`` (``root/current`` never pointed at
   C, sampled every millisecond, and is as before), ``verify-truthful``
   (verify asked about C reports B, what is active) and
   ``releases-kept-after-failure``;
6. deploy A again: ``redeploy-A`` reports A, and ``older-not-rewritten``:
   A's and B's releases are byte-identical to before;
7. when the provider implements them, activation and prune
   (:mod:`.generations`): ``activate-B``, ``activate-refuses-unbuilt``,
   ``activate-A``, ``prune-keeps-kept``, ``prune-report-truthful``.

A check whose prerequisite failed is reported failed with the reason.

The built-in ``command`` provider is tested with a site's own scripts: the
kit is given their command lines (``commands``: ``update_command``,
``install_command``, ``verify_command``; ``{root}`` in a word expands to the
disposable root) and runs the same sequence through the provider's argv
shapes (CONTRACT section 4).  Install is exercised only when an
``install_command`` was given.
"""

from __future__ import annotations

import hashlib
import os
from typing import Mapping, Sequence

from vq_admin_hookspecs import ProviderCommand, RuntimeRequest, VerifyReceipt

from ..config import RuntimeProfile
from ..core.identifiers import FULL_SHA_RE
from ..evidence import Check, parse_receipt, readback_check, receipt_checks
from ..plugins import Providers, ProviderError
from .world import LinkWatcher, World, snapshot

PROGRAM = "vqconf"
#: A release as the kit keeps it to compare later: its directory, snapshot, launcher and the launcher's hash.
Kept = tuple[str, dict[str, str], str, str | None]
#: The checks of a deploy that fails validation on purpose (commit C), which the site's own source cannot give.
FAILED_VALIDATION = ("failed-validation-exits-nonzero", "current-unchanged-until-validated", "verify-truthful",
                     "releases-kept-after-failure")
PROBE_ARGS = ("--vq-conformance-probe", "two words", "")
DEPLOY_TIMEOUT = 1800.0
VERIFY_TIMEOUT = 600.0


class Kit:
    def __init__(self, providers: Providers, name: str, world: World, options: Mapping[str, str],
                 script_args: Sequence[str] = (), commands: Mapping[str, Sequence[str]] | None = None):
        self.providers, self.name, self.world = providers, name, world
        self.options = {k: v.replace("{root}", world.root) for k, v in options.items()}
        self.script_args = tuple(script_args)
        self.commands = {k: tuple(w.replace("{root}", world.root) for w in words)
                         for k, words in (commands or {}).items() if words}
        self.checks: list[Check] = []
        #: The releases A and B once the update sequence passed (what the generations' checks work on).
        self.releases: dict[str, str] | None = None
        self.hooks = providers.info[name].hooks  # run_conformance loaded exactly this provider

    def offers(self, hook: str, command_key: str) -> bool:
        """The provider implements *hook* and, for command lines given to the kit, *command_key* was given."""
        if hook not in self.hooks:
            return False
        return not self.commands or command_key in self.commands

    @property
    def offers_install(self) -> bool:
        return self.offers("vq_admin_runtime_install", "install_command")

    # -- plumbing -------------------------------------------------------------------------

    def check(self, name: str, ok: bool, detail: str) -> bool:
        self.checks.append(Check(name, bool(ok), detail))
        return bool(ok)

    def request(self, label: str, archive: str | None, args: Sequence[str] = ()) -> RuntimeRequest:
        given = self.commands.get
        settings = RuntimeProfile(
            program=PROGRAM, provider=self.name, update_command=given("update_command"),
            install_command=given("install_command"), verify_command=given("verify_command"),
            activate_command=given("activate_command"), prune_command=given("prune_command"),
            timeout_seconds=DEPLOY_TIMEOUT, verify_timeout_seconds=VERIFY_TIMEOUT, source_repo=self.world.repo,
            provider_options=dict(self.options)).settings()
        return RuntimeRequest(program=PROGRAM, host="conformance", expected_sha=self.world.sha[label], tag=None,
                              update_script_args=tuple(args), source_archive=archive,
                              where="login-host" if archive is None else "build-host", settings=settings)

    def command(self, hook: str, request: RuntimeRequest) -> ProviderCommand:
        command: ProviderCommand = getattr(self.providers, hook)(self.name, request)
        return command

    def deploy(self, label: str, hook: str = "runtime_update") -> tuple[int | None, list[str | None], str]:
        return self.watched(self.command(hook, self.request(label, self.world.archive[label], self.script_args)),
                            DEPLOY_TIMEOUT)

    def watched(self, command: ProviderCommand, timeout: float) -> tuple[int | None, list[str | None], str]:
        """Run *command* while ``current`` is sampled: its exit status (``None`` when interrupted), the
        link targets seen, and its output's last three lines."""
        with LinkWatcher(self.world) as watcher:
            result = self.world.run(command, timeout)
        tail = " | ".join((result.error_text() or result.text()).splitlines()[-3:])
        return (None if result.interrupted else result.exit_code), watcher.seen, tail

    def verify(self, label: str) -> tuple[VerifyReceipt | None, list[Check]]:
        """Verify as the runtime lane would, with the launcher hashed here."""
        request = self.request(label, None)
        result = self.world.run(self.command("runtime_verify", request), VERIFY_TIMEOUT)
        receipt, error = parse_receipt(result.stdout)
        if receipt is None:
            return None, [Check("receipt", False, f"verify exited {result.exit_code} and printed no verify "
                                f"receipt: {error}")]
        checks = receipt_checks(receipt, PROGRAM, request.expected_sha, None)
        digest = _digest(receipt.active_path)  # the launcher hashed here, in the shape readback_check takes
        checks.append(readback_check(receipt, {"sha256": digest} if digest else None,
                                     None if digest else f"cannot read {receipt.active_path}"))
        path, roots = os.path.normpath(receipt.active_path), {self.world.root, os.path.realpath(self.world.root)}
        inside = os.path.lexists(path) and any(path.startswith(r + os.sep) for r in roots)
        checks.append(Check("active_path_below_root", inside,
                            f"{receipt.active_path} must exist below the disposable root {self.world.root}"))
        if not FULL_SHA_RE.match(receipt.source_sha):  # a str (VerifyReceipt.parse reads null as "")
            checks.append(Check("full_sha", False, f"source_sha {receipt.source_sha!r} is not a full commit SHA"))
        return receipt, checks

    def evidence(self, name: str, label: str) -> VerifyReceipt | None:
        receipt, checks = self.verify(label)
        bad = [f"{c.name}: {c.detail}" for c in checks if not c.ok]
        self.check(name, not bad,  # no receipt is a failed check of its own (verify)
                   "; ".join(bad) if bad else f"verify receipt for {label} passes every check")
        return receipt if not bad else None

    # -- the sequence ---------------------------------------------------------------------

    def run(self) -> list[Check]:
        if not self.check_hooks() or not self.check_argv_shape():
            return self.checks
        if self.offers_install:
            first = "runtime_install"
        else:
            first = "runtime_update"
            os.makedirs(self.world.root, exist_ok=True)
        a = self.proven("A", first, f"{first} of A")
        if a is None:
            return self.checks
        b = self.proven("B", "runtime_update", "update to B")
        if b is None:
            return self.checks
        (_, a_kept), (b_receipt, b_kept) = a, b
        a_dir, b_dir = a_kept[0], b_kept[0]
        nested = a_dir == b_dir or a_dir.startswith(b_dir + os.sep) or b_dir.startswith(a_dir + os.sep)
        self.check("separate-runtime", not nested, f"A lives in {a_dir}, B in {b_dir}")
        self.check_kept("older-kept-after-B", a_kept)
        link_before = self.world.current()
        if self.world.fails_on_purpose:  # the site's own source cannot be made to fail validation
            self.failed_validation(b_receipt, b_kept, a_kept, link_before)
        code, _, tail = self.deploy("A")
        ok = code == 0 and self.evidence_ok("A")
        self.check("redeploy-A", ok,
                   f"redeploying A exited {code}" + ("" if ok else f"; verify of A not proven: {tail}"))
        self.check_kept("older-not-rewritten", a_kept, b_kept)
        if ok:  # activation and prune come next (vq_admin.conformance.generations), on these releases
            self.releases = {"A": a_dir, "B": b_dir}
        return self.checks

    def proven(self, label: str, hook: str, what: str) -> tuple[VerifyReceipt, Kept] | None:
        """Deploy *label* with *hook* (``deploy-LABEL``), then ``evidence-LABEL``: its verify receipt and its
        release as kept (directory, snapshot, launcher, launcher hash), or ``None`` when either failed."""
        code, _, tail = self.deploy(label, hook)
        if not self.check(f"deploy-{label}", code == 0, f"{what} exited {code}" + (f": {tail}" if code else "")):
            return None
        receipt = self.evidence(f"evidence-{label}", label)
        if receipt is None:
            return None
        where = release_dir(receipt.active_path, receipt.source_sha)
        return receipt, (where, snapshot(where), receipt.active_path, _digest(receipt.active_path))

    def failed_validation(self, b: VerifyReceipt, b_kept: Kept, a_kept: Kept, link_before: str | None) -> None:
        """Deploy C, whose selftest fails: nothing may change, and verify must still report B."""
        code, seen, tail = self.deploy("C")
        self.check("failed-validation-exits-nonzero", code not in (0, None),
                   f"deploying C (its selftest fails) exited {code}: {tail}")
        c_sha = self.world.sha["C"]
        moved = [s for s in seen if s is not None and c_sha in s]
        now = self.world.current()
        unchanged = not moved and now == link_before
        self.check("current-unchanged-until-validated", unchanged,
                   f"current stayed {link_before!r} while C failed validation" if unchanged else
                   f"current was {link_before!r}; during the failed deploy it took {seen!r}; now {now!r}")
        receipt, _ = self.verify("C")
        active = receipt.source_sha if receipt else None
        self.check("verify-truthful", active == b.source_sha,
                   f"asked about C after its failed deploy, verify reports {active!r}; active is B {b.source_sha}")
        self.check_kept("releases-kept-after-failure", a_kept, b_kept)

    def evidence_ok(self, label: str) -> bool:
        _, checks = self.verify(label)
        return all(c.ok for c in checks)  # no receipt is a failed check of its own (verify)

    def check_hooks(self) -> bool:
        missing = [h for h in ("vq_admin_runtime_update", "vq_admin_runtime_verify") if h not in self.hooks]
        return self.check("hooks", not missing, f"missing {missing}" if missing else f"implements {list(self.hooks)}")

    def check_argv_shape(self) -> bool:
        problems: list[str] = []
        request = self.request("B", self.world.archive["B"], PROBE_ARGS)  # one request, asked of each hook
        for hook in ["runtime_update"] + (["runtime_install"] if self.offers_install else []):
            try:
                argv, again = self.command(hook, request).argv, self.command(hook, request).argv
            except ProviderError as exc:
                problems.append(f"{hook}: {exc.message}")
                continue
            if not _contiguous(argv, PROBE_ARGS):
                problems.append(f"{hook} does not pass the --update-script-arg words {list(PROBE_ARGS)} "
                                f"contiguously and unchanged: {list(argv)}")
            for word, what in ((request.expected_sha, "the full SHA"), (request.source_archive, "the staged archive")):
                if word not in argv:
                    problems.append(f"{hook} argv does not carry {what} {word} as one word: {list(argv)}")
            if argv != again:
                problems.append(f"{hook} answers the same request with different argv")
        try:
            verify = self.command("runtime_verify", self.request("B", None)).argv
            if self.world.sha["B"] not in verify:
                problems.append(f"verify argv does not carry the full SHA: {list(verify)}")
        except ProviderError as exc:
            problems.append(f"runtime_verify: {exc.message}")
        return self.check("argv-shape", not problems, "; ".join(problems) or
                          "script arguments kept contiguous and in order; full SHA and archive passed verbatim")

    def check_kept(self, name: str, *releases: Kept) -> None:
        """Each of *releases* (its directory, snapshot, launcher and the launcher's hash) is as it was."""
        problems = []
        for where, before, launcher, digest in releases:
            now = snapshot(where)
            if not now:
                problems.append(f"{where} was removed")
            elif now != before:
                changed = sorted(k for k in set(now) | set(before) if now.get(k) != before.get(k))[:5]
                problems.append(f"{where} was rewritten ({', '.join(changed)})")
            if _digest(launcher) != digest:
                problems.append(f"launcher {launcher} is gone or changed")
        self.check(name, not problems, "; ".join(problems) or "older releases and launchers are byte-identical")


def release_dir(launcher: str, sha: str) -> str:
    """The per-SHA directory of *launcher*: up to the path component that is the SHA."""
    parts = launcher.split(os.sep)
    if sha in parts:
        return os.sep.join(parts[: parts.index(sha) + 1])
    return os.path.dirname(launcher)


def _contiguous(argv: Sequence[str], words: Sequence[str]) -> bool:
    n = len(words)
    return any(tuple(argv[i:i + n]) == tuple(words) for i in range(len(argv) - n + 1))


def _digest(path: str) -> str | None:
    """SHA-256 of the file at *path* (following links, as exec does), or None."""
    try:
        with open(path, "rb") as fh:
            return hashlib.sha256(fh.read()).hexdigest()
    except OSError:
        return None
