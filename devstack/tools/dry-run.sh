#!/bin/bash
#
# Run the cinder-dmclone devstack plugin without devstack and without
# touching the machine: devstack's functions are replaced by
# devstack/tools/fake-devstack.sh, every path points into WORKDIR.
#
#   devstack/tools/dry-run.sh WORKDIR [PHASE ...]
#
# PHASE is "stack:pre-install", "stack:install", "stack:post-config",
# "stack:extra", "stack:test-config", "unstack" or "clean"; the default is
# every stack phase in devstack's order. The node is described by the
# usual devstack variables in the environment (ENABLED_SERVICES, HOST_IP,
# CINDER_DMCLONE_*...). Afterwards WORKDIR holds cinder.conf,
# tempest.conf, etc-cinder/rootwrap.d/, modules-load.conf and
# commands.log (what would have run); cinder.conf is printed.
set -o errexit -o nounset -o pipefail

if [[ $# -lt 1 ]]; then
    echo "usage: $0 WORKDIR [PHASE ...]" >&2
    exit 2
fi
WORKDIR=$(mkdir -p "$1" && cd "$1" && pwd)
shift
PHASES=("$@")
if [[ ${#PHASES[@]} -eq 0 ]]; then
    PHASES=(stack:pre-install stack:install stack:post-config stack:extra
            stack:test-config)
fi
PLUGIN_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# What devstack defines before it reads a plugin's settings.
export DEST=${DEST:-/opt/stack}
export HOST_IP=${HOST_IP-192.0.2.10}
export SERVICE_HOST=${SERVICE_HOST:-$HOST_IP}
export ENABLED_SERVICES=${ENABLED_SERVICES:-c-api,c-sch,c-vol,tempest}
export REGION_NAME=${REGION_NAME:-RegionOne}
export CINDER_CONF_DIR=$WORKDIR/etc-cinder
export CINDER_CONF=$WORKDIR/cinder.conf
export TEMPEST_CONFIG=$WORKDIR/tempest.conf
export DRYRUN_LOG=$WORKDIR/commands.log
export CINDER_DMCLONE_DIR=${CINDER_DMCLONE_DIR:-$(dirname "$PLUGIN_DIR")}
export CINDER_DMCLONE_MODULES_LOAD_FILE=$WORKDIR/modules-load.conf
mkdir -p "$CINDER_CONF_DIR"
touch "$CINDER_CONF" "$DRYRUN_LOG"

# shellcheck source=devstack/tools/fake-devstack.sh
source "$PLUGIN_DIR/tools/fake-devstack.sh"
# shellcheck source=devstack/settings
source "$PLUGIN_DIR/settings"

# The plugin's xtrace goes to xtrace.log; errors (die) to fd 3, stderr.
exec 3>&2
for phase in "${PHASES[@]}"; do
    echo "=== ${phase/:/ }" >>"$DRYRUN_LOG"
    # devstack sources plugin.sh once per phase, in its own shell.
    # shellcheck disable=SC2086
    # shellcheck source=devstack/plugin.sh
    source "$PLUGIN_DIR/plugin.sh" ${phase/:/ } 2>>"$WORKDIR/xtrace.log"
done
cat "$CINDER_CONF"
