#!/usr/bin/env bash
# The main job on the embedded default: a local demo cluster with the example
# provider.  Builds .venv on first use and installs vq-admin there as an operator
# does (not editable), then deploys one exact commit of a demo program; run it
# twice and the second run reports already-current.
#
#   bash scripts/demo.sh [--workdir DIR]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
if ! .venv/bin/python -P -c 'import vq_admin, vq_site_example, vq_admin_hookspecs' 2>/dev/null; then
    .venv/bin/pip install -q ./hookspecs ./site_example .
fi
# -P: the installed vq_admin, not the checkout's (the current directory) -- what an operator runs
exec .venv/bin/python -P -m vq_admin.demo "$@"
