#!/bin/bash
# Host prerequisites for the cinder-dmclone kernel testbed (tools/testbed/run).
#
# The host kernel of our developer and CI machines has no device-mapper, LIO
# or SCSI, so the tests run inside Debian's user-mode-linux kernel booted on a
# debootstrap root filesystem.  This script installs what the testbed scripts
# use on the host.  Idempotent: when everything is installed it only checks
# and exits (no apt-get update).
#
# Usage: tools/testbed/setup-host.sh
set -euo pipefail

PACKAGES=(
    user-mode-linux   # the guest kernel (linux.uml) and its modules
    uml-utilities     # uml_switch: the nodes' segment (--layout separate)
    debootstrap       # builds the guest root filesystem
    python3           # runs tools/testbed/run
    python3-pip       # builds the guest's wheelhouse (pip wheel) on the host
    coreutils util-linux  # sha256sum, flock, timeout
    gcc libc6-dev     # builds uml-xstate-shim.so where UML needs it
)

missing=()
for pkg in "${PACKAGES[@]}"; do
    status=$(dpkg-query -W -f='${db:Status-Abbrev}' "$pkg" 2>/dev/null || true)
    [[ $status == ii* ]] || missing+=("$pkg")
done

if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "setup-host: missing packages: ${missing[*]}; run this script as root" >&2
    exit 1
fi

echo "setup-host: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends "${missing[@]}"
