"""The ``vq-admin-agent`` console script.

``verify-readback`` (what every runtime update's verify runs: the read-only
verify plus the launcher read-back, see :mod:`.verify_readback`),
``session`` (a run's first call, :mod:`.session`) and ``stage-receive`` in
the driver's own words (``stage-receive --stage DIR``: the source archive
streamed in) are served before the full verb table (:mod:`.cli`: argparse,
tarfile, the allocation modules) is imported, so the remote start of an
already-current run stays close to a bare interpreter and a source
archive's transfer does not wait for them.  Every other verb goes to
:func:`.cli.main`.
The verbs' names are the protocol's (:mod:`vq_admin.core.protocol`, cheap to import).
"""

from __future__ import annotations

import os
import sys

from ..core.protocol import SESSION, STAGE, STAGE_RECEIVE, VERIFY_READBACK

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import NoReturn

#: The verbs whose process ends with ``os._exit`` once answered (:func:`run`).
PROMPT_EXIT = (SESSION, VERIFY_READBACK)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == [VERIFY_READBACK]:
        from .verify_readback import main as verify_readback

        return verify_readback(argv[1:])
    if argv[:1] == [SESSION]:  # a run's first call: probe, lease, check-paths and verify in one start
        from .session import main as session

        return session(argv[1:])
    if argv[:2] == [STAGE_RECEIVE, STAGE] and len(argv) == 3 and not argv[2].startswith("-"):
        from ..core.safedirs import verb_status
        from .stage import receive_verb

        return verb_status(lambda: receive_verb(argv[2]))
    from .cli import main as full

    return full(argv)


def run() -> NoReturn:
    """The process: :func:`main` on its own argv, then exit with its status.

    A fast verb (:data:`PROMPT_EXIT`) has released what it held and written
    its answer when :func:`main` returns, and it leaves no thread, child or
    temporary file to clean up: its output is flushed and the process ends
    with ``os._exit``, without the interpreter's teardown.  Every other verb
    (and an exception) exits the ordinary way.
    """
    code = main()
    if sys.argv[1:2] and sys.argv[1] in PROMPT_EXIT:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except (OSError, ValueError):  # the reader is gone: the interpreter's exit would say so, and exit 120
            os._exit(120)
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    run()
