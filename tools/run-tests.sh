#!/bin/bash
# Set up a fresh Debian 12 machine (as root) and run the CI suites: pep8,
# the unit tests (tox -e py3), the docs, the release notes, the sample
# configuration, the devstack plugin's lint and the functional suite's CI
# tier in the real-kernel testbed, each node its own kernel (tox -e
# functional-separate).  Exits non-zero on any failure.
#
# The unit tests with coverage (tox -e cover, at least 90 percent) are
# not in the default list: coverage's tracer doubles the unit suite's
# time (145 tests: 41 s plain, 76 s traced), and on a slow machine the
# whole run came within 22 minutes of CI's 90 (68 minutes, 4104 s, on
# 2026-11-28).  Run it by name; its last result is in
# doc/source/contributor/testing.rst.
#
#   tools/run-tests.sh            # the CI suites (CI runs this)
#   tools/run-tests.sh pep8,py3   # only the named tox environments
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/.."
ENVS=${1:-pep8,py3,docs,releasenotes,genconfig,devstack,functional-separate}
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
