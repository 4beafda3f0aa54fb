#!/bin/bash
# Lint every shell script of the devstack plugin with shellcheck (tox -e devstack).
set -o errexit -o nounset -o pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
if ! command -v shellcheck >/dev/null; then
    echo "shellcheck is not installed: apt-get install shellcheck" \
        "(tools/run-tests.sh does it)" >&2
    exit 1
fi
shellcheck --version | sed -n 2p
shellcheck -x devstack/plugin.sh devstack/settings devstack/lib/cinder-dmclone \
    devstack/tools/*.sh
echo "shellcheck: no findings"
