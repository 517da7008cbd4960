#!/usr/bin/env bash
# The main job on the embedded default: a local demo cluster with the example
# provider.  Builds .venv on first use, then deploys one exact commit of a demo
# program; run it twice and the second run reports already-current.
#
#   bash scripts/demo.sh [--workdir DIR]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
if ! .venv/bin/python -c 'import vq_admin, vq_site_example, vq_admin_hookspecs' 2>/dev/null; then
    .venv/bin/pip install -q -e ./hookspecs -e ./site_example -e .
fi
exec .venv/bin/python -m vq_admin.demo "$@"
