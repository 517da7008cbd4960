#!/usr/bin/env bash
# Run the test suite: install the real daemons the integration tests need
# (Debian packages, as root), build .venv with the project and its test
# extras, then run pytest from the repo root.  Arguments go to pytest.
#
#   bash scripts/test.sh            # everything
#   bash scripts/test.sh -q -m real # only the real-daemon tests
#
# ruff and mypy --strict run before pytest; a finding fails the run.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

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

# Static checks first (configured in pyproject.toml): a finding fails the run.
.venv/bin/ruff check
.venv/bin/mypy

set +e
.venv/bin/python -m pytest "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
    echo "scripts/test.sh: pytest collected no tests; failing (CI must not pass on an empty run)" >&2
    exit 1
fi
exit "$rc"
