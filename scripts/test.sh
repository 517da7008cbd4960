#!/usr/bin/env bash
# Run the test suite: install the real daemons the integration tests need
# (Debian packages, as root), build .venv with the project and its test
# extras, then run pytest from the repo root.  Arguments go to pytest.
#
#   bash scripts/test.sh            # everything
#   bash scripts/test.sh -q -m real # only the real-daemon tests
#   VQ_TEST_WORKERS=0 bash scripts/test.sh   # in one process (default: 8 pytest-xdist workers)
#
# The tests run in VQ_TEST_WORKERS parallel pytest-xdist workers (default 8:
# most tests wait on daemons and subprocesses, so 8 pay even on 2 cores; with
# the fault table in chunks, the 1425 tests took 6m57s with 6 workers, the two
# cores idle for 197 CPU-seconds of it, and 6m33s with 8, idle for 58); each
# worker starts its own daemons on its own ports.  The last line is the
# suite's wall time.
#
# ruff and mypy --strict run before pytest; a finding fails the run.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

workers=${VQ_TEST_WORKERS:-8}
if ! [[ "$workers" =~ ^([0-9]+|auto)$ ]]; then
    echo "scripts/test.sh: VQ_TEST_WORKERS must be a number or 'auto', not '$workers'" >&2
    exit 2
fi

DEBS=(slurmctld slurmd slurm-client munge openssh-server openssh-client git groff-base man-db bash-completion zsh tcsh)
POLICY=/usr/sbin/policy-rc.d
created_policy=0

remove_policy() {
    if [ "$created_policy" = 1 ]; then
        rm -f "$POLICY"
        created_policy=0
    fi
}
trap remove_policy EXIT

missing=()
for pkg in "${DEBS[@]}"; do
    status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
    if [ "$status" != "install ok installed" ]; then
        missing+=("$pkg")
    fi
done

if [ "${#missing[@]}" -gt 0 ]; then
    echo "scripts/test.sh: installing ${missing[*]}" >&2
    if [ ! -e "$POLICY" ]; then
        # Keep postinst scripts from starting system daemons; the tests start their own.
        printf '#!/bin/sh\nexit 101\n' > "$POLICY"
        chmod 0755 "$POLICY"
        created_policy=1
    fi
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
    remove_policy
fi

if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
.venv/bin/pip install -q -e ./hookspecs -e ./site_example -e '.[test]'
# Byte-compile the tree once (into the usual, git-ignored __pycache__ directories).  Where
# PYTHONDONTWRITEBYTECODE is set, no interpreter writes its own cache, and each of the suite's
# thousands of interpreter starts (vq-admin, the agent over ssh, the site example, each pytest
# worker) would compile the project's modules it imports again (here about 30 ms of CPU more per
# agent start, 20 to 60 ms per vq-admin run, medians of 10).
.venv/bin/python -m compileall -q -j 0 vq_admin hookspecs site_example tests
# pytest's rewritten test modules get their own cache (tests/__pycache__/*-pytest-*.pyc), which it
# reads whatever PYTHONDONTWRITEBYTECODE says but writes only where it is unset: write it once here,
# so that no worker rewrites every test module again (here about 3 s of CPU per worker).
env -u PYTHONDONTWRITEBYTECODE .venv/bin/python -m pytest --collect-only -q -p no:cacheprovider >/dev/null

# Static checks first (configured in pyproject.toml): a finding fails the run.
.venv/bin/ruff check
.venv/bin/mypy

parallel=()
if [ "$workers" != 0 ]; then
    # --maxschedchunk 1: each worker holds one test beyond the one it runs, so the slowest
    # tests (first in the order tests/conftest.py gives) spread over the workers.
    parallel=(-n "$workers" --maxschedchunk 1)
fi
started=$(date +%s)
set +e
.venv/bin/python -m pytest "${parallel[@]}" "$@"
rc=$?
set -e
elapsed=$(( $(date +%s) - started ))
printf 'scripts/test.sh: suite wall time: %dm%02ds (pytest, VQ_TEST_WORKERS=%s); whole run %dm%02ds\n' \
    $(( elapsed / 60 )) $(( elapsed % 60 )) "$workers" $(( SECONDS / 60 )) $(( SECONDS % 60 ))
if [ "$rc" -eq 5 ]; then
    echo "scripts/test.sh: pytest collected no tests; failing (CI must not pass on an empty run)" >&2
    exit 1
fi
exit "$rc"
