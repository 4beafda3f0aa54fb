#!/bin/bash
# The main job: on a fresh Debian 12 machine (as root), set up the testbed
# and show a volume moving from node A to node B and back, with progress
# (each node its own guest kernel: tools/testbed/run --layout separate).
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/.."
bash tools/testbed/setup-host.sh
exec bash tools/testbed/run --layout separate -- -s -p no:warnings --log-cli-level=CRITICAL \
    tests/demo/test_demo.py
