#!/bin/bash
# Set up a fresh Debian 12 machine (as root) and run every test suite:
# pep8, the unit tests with coverage, and the functional suite's CI tier
# in the real-kernel testbed, each node its own kernel (tox -e
# functional-separate).  Exits non-zero on any failure.
#
#   tools/run-tests.sh            # everything
#   tools/run-tests.sh pep8,py3   # only the named tox environments
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/.."
ENVS=${1:-pep8,cover,docs,releasenotes,genconfig,devstack,functional-separate}
CACHE=${DMCLONE_CACHE:-/var/cache/cinder-dmclone}
export DEBIAN_FRONTEND=noninteractive

step() { printf '\n=== %s: %s\n' "$(date +%H:%M:%S)" "$*"; }

step "host packages"
missing=()
for pkg in python3 python3-venv git; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
# tox -e devstack lints the devstack plugin with Debian's shellcheck.
case ",$ENVS," in *,devstack,*)
    dpkg -s shellcheck >/dev/null 2>&1 || missing+=(shellcheck) ;;
esac
if [ ${#missing[@]} -gt 0 ]; then
    apt-get update -q
    apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
case ",$ENVS," in *,functional-separate,*|*,functional-separate-extended,*)
    bash tools/testbed/setup-host.sh ;;
esac

step "tox"
# tox lives in its own virtualenv (Debian's python refuses system-wide pip),
# with tox-uv: uv builds the environments' virtualenvs (each of them from
# the same constraints) in a tenth of pip's time, most of a slow machine's
# setup before.
TOXVENV=$CACHE/tox-venv
if ! "$TOXVENV/bin/python" -c 'import tox_uv' 2>/dev/null; then
    python3 -m venv "$TOXVENV"
    "$TOXVENV/bin/pip" install -q 'tox>=4.0.0,<5.0.0' 'tox-uv>=1.0.0,<2.0.0'
fi
"$TOXVENV/bin/tox" --version

step "tox -e $ENVS"
"$TOXVENV/bin/tox" -e "$ENVS"
