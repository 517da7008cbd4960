"""``update PROGRAM HOST --expected-sha SHA``, what cron runs most: its first call's ssh started first.

For a plainly usual ``update PROGRAM HOST --expected-sha SHA`` the console
script (:func:`vq_admin.entry.main`) calls :func:`start` before argparse and
the rest of the command line are imported: it reads the configuration
(:func:`vq_admin.config.load_config`, the one reader), opens the run's
:class:`~vq_admin.ssh.transport.Session` and starts the run's first call, the
agent's ``session``, on the host's login host (:func:`vq_admin.ssh.early_session.start`,
as the full path would).  The :class:`EarlyStart` it returns is handed to the full command line,
whose lane runner (:func:`vq_admin.lanes.runner.run_lane`) takes its
configuration and session instead of reading and opening them again, so the
ssh handshake goes on while the driver imports and plans.

Anything unusual (another command line, a configuration the full path would
refuse, a host without ssh or without a profile of PROGRAM, a dry run) starts
nothing here; the full path then behaves, and reports, exactly as without.
A run that ends before sending the session's request closes it
(:meth:`EarlyStart.close`): nothing asked, nothing done (:mod:`.early_session`).
"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's: this module is imported before the command line is
if TYPE_CHECKING:
    from ..config import Config
    from .transport import Session

#: ``update`` options this entry takes (each once), and the key each sets; any other word but
#: the two operands leaves the command line to the full parser.
_VALUED = {"--expected-sha": "expected_sha", "--tag": "tag", "--config": "config", "--state-dir": "state_dir",
           "--wait-lock": "wait_lock"}
_FLAGS = {"--json": "json", "--verbose": "verbose", "-v": "verbose"}


class EarlyStart:
    """The configuration an ``update`` read first and the session whose first ssh process it started."""

    def __init__(self, config: Config, session: Session):
        self.config, self.session = config, session

    def close(self) -> None:
        """End what nothing took over (the session's unsent first call: nothing asked)."""
        self.session.close()


def parse_update(words: list[str]) -> dict[str, str] | None:
    """*words* after ``update``: ``program``, ``host``, ``expected_sha`` and the options given,
    or ``None`` unless they are plainly ``PROGRAM HOST --expected-sha SHA`` with a few options
    (:mod:`vq_admin.core.plainargs`)."""
    from ..core.plainargs import plain_words

    parsed = plain_words(words, _VALUED, _FLAGS, together=True)
    if parsed is None:
        return None
    operands, values, _flags = parsed
    if len(operands) != 2 or "expected_sha" not in values:
        return None
    values["program"], values["host"] = operands
    return values


def start(words: list[str]) -> EarlyStart | None:
    """The early start of ``update`` *words* when they and the configuration are plainly usual;
    never raises: anything unusual starts nothing."""
    try:
        return _start(words)
    except Exception:  # noqa: BLE001 -- anything unusual is the full path's to report
        return None


def _start(words: list[str]) -> EarlyStart | None:
    values = parse_update(words)
    if values is None:
        return None
    from ..core.identifiers import FULL_SHA_RE, NAME_RE, TAG_RE

    for key, rule in (("expected_sha", FULL_SHA_RE), ("program", NAME_RE), ("host", NAME_RE), ("tag", TAG_RE)):
        if key in values and not rule.match(values[key]):  # (all but the tag are always there: parse_update)
            return None
    from ..config import authority, load_config
    from .argv import literal_words

    config = load_config(values.get("config"))
    host = authority.runtime_host(config, values["host"])
    if values["program"] not in host.runtimes or host.transport != "ssh" or not literal_words(host.agent):
        return None  # (before the session: its ssh -G judgement is the full path's then)
    from . import effective

    effective.start(config.ssh_config, host.ssh)  # its ssh -G runs while this goes on; Session.ssh waits for it
    from ..core.agentjudge import blob
    from . import early_session
    from .transport import Session

    blob()  # the agent judge's program, which the session's command carries
    session = Session(config.ssh_config)
    try:
        early_session.start(session.ssh(host.ssh), host.agent)
    except BaseException:
        session.close()
        raise
    return EarlyStart(config, session)
