"""The scheduler-side helper (``vq-admin-agent``): verbs the driver runs on a
login or build host.  Standard library only; imports nothing of the driver.

Every way the agent starts (the ``vq-admin-agent`` script, ``python -m
vq_admin.agent``, the single file ``vq-admin-agent.pyz``) imports this package
first, and its modules need Python 3.8: an older interpreter gets one line and
exit 77 here, before any of them is compiled.  Keep this file readable by old
Pythons (no f-strings, no annotations).
"""

import sys

#: The refusal's first words: the driver reports the agent's line as it is (:mod:`vq_admin.lease`).
TOO_OLD = "vq-admin-agent needs Python 3.8 or later"

if sys.version_info < (3, 8):
    import os

    _dirs = os.environ.get("PATH", os.defpath).split(os.pathsep)
    _newer = [p for p in (os.path.join(d, "python3.%d" % n) for n in range(13, 7, -1) for d in _dirs)
              if os.access(p, os.X_OK)] + ["/usr/bin/python3.9"]
    _file = os.path.abspath(sys.argv[0]) if sys.argv[0].endswith(".pyz") else "/opt/vq/vq-admin-agent.pyz"
    sys.stderr.write("%s; %s runs %s %s; set `agent` to a newer interpreter, e.g. \"%s %s\"\n"
                     % (TOO_OLD, os.uname()[1], sys.executable, sys.version.split()[0], _newer[0], _file))
    sys.exit(77)
