"""``vq admin provider install SRC --host HOST --dest PATH [--on DEST] [--dry-run]``.

Installs one reviewed private site command (a provider script) on a host,
independently of every product archive:

* **refused (77)** before anything runs when SRC lies inside a product source
  tree or a staged product archive: this vq-admin checkout, any
  ``helper_source_repo``/``source_repo``/``feed_source_mirror`` of the
  configuration, any directory holding a vq-admin source tree, a stage
  (``.../.vq-admin/stage/...``) or a directory carrying product identity
  files (``SOURCE-SHA``, ``SOURCE-TREE-SHA256``, ``ARCHIVE-SHA256``,
  ``.vq-admin-source.json``).  The agent applies the same marker rule to
  the destination on the host;
* the host must be ``managed`` or ``helper-only`` (an alias names its
  canonical host);
* the copy is made by ``vq-admin-agent install-file`` on the host: temp file
  in the destination directory, fsync, rename -- a crash leaves the old file;
* the admin log and an immutable receipt record the old and new SHA-256, the
  interpreter mapping of both versions on that host, who, where and when;
* the configuration is never read for writing, never edited: configured
  command arguments stay exactly as they are.

An interrupted transport is resolved by reading the destination's hash back:
the new hash proves the install, anything else is ``unknown`` (3).  Both
calls are steps of the run's plan, run as planned (:func:`vq_admin.plan.execute`):
``install-file``, and ``install-readback`` (``hash-file DEST``), run only when
the install did not end ok and skipped otherwise.
"""

from __future__ import annotations

import argparse
import getpass
import hashlib
import os
import socket

from .config import authority
from .core import exits, protocol
from .agent.install_file import PRODUCT_MARKERS
from .core.securepath import ancestors, opened_problem
from .config import Config, HostConfig, load_config
from .report.outcome import Outcome, Refused, UsageError
from .report.output import report, safe_message
from .plan import Plan, Step, execute
from .report.receipt import Receipt
from .report.sections import Install, InstalledBy, Installer, Readback
from .state.records import LogLine, StateDir
from .core.stamps import utc_now
from .ssh.transport import RunResult, Session, Transport, quote_argv

MAX_SOURCE_BYTES = 16 << 20
#: Seconds the install and its read-back may take.
INSTALL_TIMEOUT = 300.0
READBACK_TIMEOUT = 120.0
#: The read-back step's name.
READBACK = "install-readback"


def own_checkout() -> str:
    """The directory holding this ``vq_admin`` package (a checkout or site-packages)."""
    import vq_admin

    return os.path.realpath(os.path.dirname(os.path.dirname(os.path.abspath(vq_admin.__file__))))


def product_roots(config: Config) -> list[tuple[str, str]]:
    """``(path, what)`` of every product tree the configuration and this install know."""
    own = own_checkout()
    roots = [(own, "this vq-admin checkout") if _is_source_tree(own)
             else (os.path.join(own, "vq_admin"), "the installed vq-admin package")]
    for host in config.hosts.values():
        if host.helper_source_repo:
            roots.append((host.helper_source_repo, f"hosts.{host.name}.helper_source_repo"))
        for program, profile in host.runtimes.items():
            key = f"hosts.{host.name}.scheduler_runtime_deployments.{program}"
            roots.append((profile.source_repo, f"{key}.source_repo"))
            if profile.feed_source_mirror:
                roots.append((profile.feed_source_mirror, f"{key}.feed_source_mirror"))
    return [(os.path.realpath(p), what) for p, what in roots]


def _is_source_tree(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "vq_admin", "core", "treeid.py")) and (
        os.path.exists(os.path.join(path, ".git")) or os.path.isfile(os.path.join(path, "setup.cfg")))


def source_refusal(src: str, config: Config) -> str | None:
    """Why SRC must not be installed as a private site command, or None."""
    paths = {os.path.abspath(src), os.path.realpath(src)}
    for path in sorted(paths):
        if f"{os.sep}.vq-admin{os.sep}stage{os.sep}" in path:
            return f"{src} lies inside a vq-admin stage ({path}): a staged product archive is not a provider"
        for root, what in product_roots(config):
            if path == root or path.startswith(root.rstrip(os.sep) + os.sep):
                return f"{src} lies inside {what} ({root}): product sources never provide site commands"
        for current in ancestors(path):  # the nearest level first; at one level, a source tree first
            if _is_source_tree(current):
                return f"{src} lies inside a vq-admin source tree ({current})"
            for marker in PRODUCT_MARKERS:
                if os.path.lexists(os.path.join(current, marker)):
                    return (f"{src} lies inside {current}, which holds {marker}: a staged or installed product "
                            "archive is not a provider")
    return None


def _host(config: Config, name: str) -> HostConfig:
    return authority.with_role(config, name, "provider", authority.HELPER_ROLES, instead="install on")


def _destinations(host: HostConfig) -> list[str]:
    found = [host.ssh, host.helper_update_host, *(p.update_host for p in host.runtimes.values())]
    return list(dict.fromkeys(d for d in found if d))  # ssh is never empty (the host's name by default)


def _check_args(args: argparse.Namespace, host: HostConfig) -> tuple[str, bytes]:
    dest = args.dest
    if not dest.startswith("/") or os.path.normpath(dest) != dest or "\n" in dest or "\0" in dest:
        raise UsageError(f"--dest {dest!r} must be an absolute, normalised path")
    if args.on is not None and args.on not in _destinations(host):
        raise UsageError(f"--on {args.on!r} is not a destination of host {host.name} "
                         f"(configured: {', '.join(_destinations(host))})")
    try:
        mode = int(args.mode, 8)
    except ValueError:
        raise UsageError(f"--mode {args.mode!r} is not an octal mode such as 0755") from None
    if mode & ~0o777:  # a negative mode has every bit above 0o777 set
        raise UsageError(f"--mode {args.mode}: setuid, setgid and sticky bits are refused on a site command "
                         "(it runs as the administrator); use a mode such as 0755")
    if mode & 0o022:
        raise UsageError(f"--mode {args.mode}: group/other write bits are refused; use a mode such as 0755")
    if not os.path.isfile(args.src):
        raise UsageError(f"SRC {args.src} is not a regular file")
    with open(args.src, "rb") as fh:  # judged as opened: what is read is what passed the rule
        problem = opened_problem(args.src, fh.fileno(), os.fstat(fh.fileno()), what="SRC")
        if problem:
            raise Refused(f"{problem}; it would become a trusted command run as the administrator; nothing was "
                          "installed")
        data = fh.read(MAX_SOURCE_BYTES + 1)
    if len(data) > MAX_SOURCE_BYTES:
        raise UsageError(f"SRC {args.src} is larger than {MAX_SOURCE_BYTES} bytes")
    return dest, data


def run(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    host = _host(config, args.host)
    dest, data = _check_args(args, host)
    refusal = source_refusal(args.src, config)
    if refusal:
        raise Refused(refusal)
    state = StateDir(args.state_dir)
    argv = protocol.install_file(host.agent, dest=dest, mode=args.mode)
    receipt = Receipt(lane="provider", host=host.name, program=None, expected_sha=None, tag=None,
                      started_at=utc_now())
    with Session(config.ssh_config) as session:
        transport = session.ssh(args.on) if args.on else session.for_host(host.transport, host.ssh)
        install = receipt.install = Install(
            src=os.path.abspath(args.src), src_sha256=hashlib.sha256(data).hexdigest(), dest=dest, mode=args.mode,
            by=Installer(user=getpass.getuser(), uid=os.geteuid(), driver=socket.gethostname()), config=config.path,
            config_edited=False, where=transport.where)
        step = receipt.plan.add("install-file", transport.where, argv,
                                f"install {install.src} as {dest} (temp file, fsync, rename)")
        receipt.plan.add(READBACK, transport.where, protocol.hash_file(host.agent, dest),
                         f"only when install-file did not end ok: the SHA-256 {dest} holds, read back")
        if args.dry_run:
            receipt.install = install.replace(transport_argv=transport.describe_argv(argv))
            report(receipt.plan_dict(), [f"vq-admin: dry run: would install {args.src} as {dest} on {transport.where}",
                                         f"  {quote_argv(argv)} < {args.src}"],
                   as_json=args.json, success=True, verbose=True)
            return 0
        result = execute(step, transport, timeout=INSTALL_TIMEOUT, stdin=data)
        outcome, receipt.install = _judge(receipt, install, step, result, transport, host)
    receipt.plan.skip_unrun()
    receipt.id = state.new_receipt_id("provider", host.name, None)
    document = receipt.finish(outcome, utc_now()).to_dict()
    path = state.store_receipt(receipt.id, document)
    install = receipt.install
    state.append_log(LogLine(at=receipt.finished_at, lane="provider", host=host.name, dest=dest, where=install.where,
                             outcome=outcome.value, exit_code=outcome.exit_code, old_sha256=install.old_sha256 or None,
                             new_sha256=install.new_sha256 or None, interpreter=install.interpreter or None,
                             by=install.by.to_value(), receipt=str(path), errors=tuple(receipt.errors[:5])))
    report(document, _summary(outcome, receipt, install, str(path)), as_json=args.json, success=outcome.success,
           verbose=False)
    return outcome.exit_code


def _judge(receipt: Receipt, install: Install, step: Step, result: RunResult, transport: Transport,
           host: HostConfig) -> tuple[Outcome, Install]:
    """The outcome of the install, and the receipt's ``install`` section with what the host answered."""
    if result.ok:
        try:  # a JSON object whose members have their types, or ProtocolError
            answer = protocol.parse_install_file(result.stdout)
        except protocol.ProtocolError:
            receipt.errors.append("install-file printed no JSON object")
            return Outcome.FAILED, install
        install = install.replace(installed_by=InstalledBy(user=answer.get("user"), uid=answer.get("uid"),
                                                           host=answer.get("hostname")),
                                  **{k: answer.get(k) for k in ("old_sha256", "new_sha256", "old_mode", "changed",
                                                                "interpreter", "old_interpreter", "user", "uid",
                                                                "hostname", "at")})
        if answer.get("new_sha256") != install.src_sha256:
            receipt.errors.append(f"the host reports {answer.get('new_sha256')}, SRC is {install.src_sha256}")
            return Outcome.FAILED, install
        return Outcome.OK, install
    # the agent's own words, at length (the plan's record keeps the last three lines)
    step.detail = (f"{result.describe()}: " if result.interrupted else "") + result.error_text()[-2000:]
    held = _hash_back(receipt.plan, transport)
    receipt.readback = Readback(read=f"{protocol.HASH_FILE} {install.dest} on {transport.where}", dest_sha256=held)
    if result.interrupted:
        receipt.errors.append(f"install-file: {result.describe()}")
        if held == install.src_sha256:
            return Outcome.OK, install.replace(new_sha256=held)
        if result.where == "local" and result.exit_code is not None and result.exit_code < 0 and held is not None:
            # A local install-file killed by a signal is dead (it was our child): the read-back shows what
            # it left, and the rename it did not reach will never happen.
            return Outcome.FAILED, install.replace(old_sha256=held)
        receipt.readback = receipt.readback.replace(next_command=quote_argv(
            ["vq", "admin", "provider", "install", install.src, "--host", host.name, "--dest", install.dest]))
        return Outcome.UNKNOWN, install
    receipt.errors.append(f"install-file: {result.describe()}: {result.error_text()[-300:]}")
    return (Outcome.REFUSED if result.exit_code == exits.EXIT_UNSAFE else Outcome.FAILED,
            install.replace(old_sha256=held))


def _hash_back(plan: Plan, transport: Transport) -> str | None:
    """Run the planned ``install-readback`` step; the SHA-256 the destination holds, if it answered one."""
    result = execute(plan.get(READBACK), transport, timeout=READBACK_TIMEOUT)
    try:
        return protocol.parse_hash_file(result.stdout).get("sha256")
    except protocol.ProtocolError:
        return None


def _summary(outcome: Outcome, receipt: Receipt, install: Install, path: str) -> list[str]:
    interp = install.interpreter if isinstance(install.interpreter, dict) else {}
    resolved = interp.get("command_resolved") or interp.get("program_resolved")
    lines = [(f"vq-admin: provider install {install.dest} on {install.where}: {outcome.value} "
              f"(exit {outcome.exit_code})"),
             f"  old sha256  {install.old_sha256 or '-'}",
             f"  new sha256  {install.new_sha256 or '-'}"]
    if interp:
        lines.append(f"  interpreter {interp.get('shebang') or interp.get('kind')} -> {resolved or '?'}")
    lines += [f"  error       {e}" for e in receipt.errors]
    lines.append(f"  receipt     {path}")
    return [safe_message(line) for line in lines]
