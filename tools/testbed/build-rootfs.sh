#!/bin/bash
# Build (or reuse) the testbed guest's root filesystem and print its path.
#
# The rootfs is a Debian bookworm minbase debootstrap directory that the
# user-mode-linux guest boots from through hostfs.  It holds the guest's
# Debian packages (tools/testbed/packages.txt), the UML kernel's modules, the
# stage-0 init (tools/testbed/stage0) and a Python venv (/opt/dmclone-venv)
# with the project's pinned requirements.  The project itself is not baked in:
# the guest mounts the working tree at /src.
#
# Cache: ${DMCLONE_TESTBED_CACHE:-/var/cache/cinder-dmclone/testbed}/
#   rootfs-<hash>/     the rootfs; <hash> covers every input listed in
#                      inputs_manifest below; complete iff it holds
#                      .testbed-rootfs-complete (written last, then the
#                      directory is renamed into place atomically)
#   wheelhouse-<hash>/ wheels of the requirements, built on the host
#   debs/              debootstrap's .deb cache
#   lock               serialises builds (and guests, see ./run)
# A present and complete rootfs is reused; any other rootfs-* is pruned.
#
# Usage: tools/testbed/build-rootfs.sh [--force]
#   stdout: the rootfs path (only that); progress and logs: stderr.
# Environment:
#   DMCLONE_TESTBED_CACHE   cache directory (see above)
#   DMCLONE_TESTBED_MIRROR  Debian mirror URI (default: this machine's apt
#                           configuration, the source serving bookworm)
#   DMCLONE_TESTBED_HOST_PYTHON  a Python 3.11 with pip on the host that
#                           builds the wheelhouse (default: python3, then
#                           /usr/bin/python3)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
CACHE=${DMCLONE_TESTBED_CACHE:-/var/cache/cinder-dmclone/testbed}
SUITE=bookworm
VENV=/opt/dmclone-venv
STAMP=.testbed-rootfs-complete
REQ_FILES=(requirements.txt test-requirements.txt constraints.txt
           tools/testbed/stack-requirements.txt)

FORCE=0
case "${1:-}" in
    --force) FORCE=1 ;;
    "") ;;
    *) echo "usage: $0 [--force]" >&2; exit 2 ;;
esac

T0=$SECONDS
log() { printf 'build-rootfs [%4ds] %s\n' $((SECONDS - T0)) "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

[ "$(id -u)" -eq 0 ] || die "must run as root (debootstrap, chroot)"
command -v debootstrap >/dev/null && command -v linux.uml >/dev/null \
    || die "host tools missing: run tools/testbed/setup-host.sh"

uml_kernel_version() {
    local dirs=(/usr/lib/uml/modules/*)
    [ ${#dirs[@]} -eq 1 ] && [ -d "${dirs[0]}" ] \
        || die "expected exactly one module tree under /usr/lib/uml/modules"
    basename "${dirs[0]}"
}
KVER=$(uml_kernel_version)
UML_PKG=$(dpkg-query -W -f='${Version}' user-mode-linux)

# Packages from packages.txt, comments and blank lines dropped.
mapfile -t PACKAGES < <(sed -e 's/#.*//' -e 's/[[:space:]]//g' -e '/^$/d' "$HERE/packages.txt")

# Every input of the build; its hash names the rootfs directory.
inputs_manifest() {
    (cd "$HERE" && sha256sum build-rootfs.sh packages.txt stage0)
    (cd "$REPO" && sha256sum "${REQ_FILES[@]}")
    echo "suite $SUITE"
    echo "uml-kernel $KVER user-mode-linux $UML_PKG"
}
HASH=$(inputs_manifest | sha256sum | cut -c1-16)
ROOTFS=$CACHE/rootfs-$HASH

mkdir -p "$CACHE"
# The runner holds the lock already and hands us its descriptor.
if [ -z "${DMCLONE_TESTBED_LOCK_FD:-}" ]; then
    exec {lock_fd}>"$CACHE/lock"
    if ! flock -n "$lock_fd"; then
        log "waiting for the testbed cache lock ($CACHE/lock)"
        flock "$lock_fd"
    fi
fi

prune() {
    local d
    for d in "$CACHE"/rootfs-* "$CACHE"/wheelhouse-* "$CACHE"/.build-*; do
        [ -e "$d" ] || continue
        case "$d" in "$ROOTFS"|"$WHEELHOUSE") continue ;; esac
        log "pruning $d"
        rm -rf --one-file-system "$d"
    done
}

if [ "$FORCE" -eq 0 ] && [ -f "$ROOTFS/$STAMP" ]; then
    log "reusing $ROOTFS"
    echo "$ROOTFS"
    exit 0
fi

# ---- which Debian mirror: the one this machine's apt uses for $SUITE ----
detect_mirror() {
    if [ -n "${DMCLONE_TESTBED_MIRROR:-}" ]; then
        echo "$DMCLONE_TESTBED_MIRROR"; return
    fi
    local f uri
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        # deb822: blank-line separated stanzas; first URI of an enabled
        # "deb" stanza whose Suites include exactly $SUITE.
        uri=$(awk -v suite="$SUITE" '
            function flush() {
                if (!found && enabled && types ~ /(^| )deb( |$)/ &&
                    (" " suites " ") ~ (" " suite " ") && uris != "") {
                    split(uris, u, " "); print u[1]; found = 1
                }
                types = suites = uris = ""; enabled = 1
            }
            BEGIN { enabled = 1 }
            /^[ \t]*$/ { flush(); next }
            /^#/ { next }
            { key = tolower($1); val = $0; sub(/^[^:]*:[ \t]*/, "", val) }
            key == "types:" { types = val }
            key == "suites:" { suites = val }
            key == "uris:" { uris = val }
            key == "enabled:" { enabled = (tolower(val) != "no") }
            END { flush() }' "$f")
        [ -n "$uri" ] && { echo "$uri"; return; }
    done
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -f "$f" ] || continue
        uri=$(awk -v suite="$SUITE" '
            $1 == "deb" {
                i = 2
                if ($i ~ /^\[/) { while ($i !~ /\]$/) i++; i++ }
                if ($(i + 1) == suite) { print $i; exit }
            }' "$f")
        [ -n "$uri" ] && { echo "$uri"; return; }
    done
    return 1
}

host_python() {
    local py
    for py in ${DMCLONE_TESTBED_HOST_PYTHON:-} python3 /usr/bin/python3; do
        command -v "$py" >/dev/null || continue
        "$py" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null || continue
        "$py" -m pip --version >/dev/null 2>&1 || continue
        echo "$py"; return
    done
    return 1
}

MIRROR=$(detect_mirror) || die "cannot find the Debian $SUITE mirror in /etc/apt (set DMCLONE_TESTBED_MIRROR)"
PY=$(host_python) || die "no Python 3.11 with pip on the host (the guest's python is 3.11)"

# The wheelhouse depends only on the requirement files and the Python version.
WH_HASH=$( (cd "$REPO" && sha256sum "${REQ_FILES[@]}"; "$PY" -c 'import sys; print(sys.version_info[:2])') \
           | sha256sum | cut -c1-16)
WHEELHOUSE=$CACHE/wheelhouse-$WH_HASH
BUILD=$CACHE/.build-$HASH
LOGDIR=$BUILD.logs
rm -rf --one-file-system "$BUILD" "$LOGDIR"
mkdir -p "$BUILD" "$LOGDIR" "$CACHE/debs"

# debootstrap mounts /proc and /sys inside the target while it installs;
# never leave them behind (a later rm -rf of the build dir would meet them).
umount_under() {
    local m
    awk -v d="$1" '$2 == d || index($2, d "/") == 1 { print $2 }' /proc/mounts | sort -r |
        while read -r m; do umount -l "$m" || true; done
}
trap 'umount_under "$BUILD"' EXIT

show_log_tail() { log "last lines of $1:"; tail -n 30 "$1" >&2 || true; }

log "building $ROOTFS (mirror $MIRROR, UML kernel $KVER, host python $PY)"

# ---- 1. wheelhouse (host, in the background while debootstrap runs) ----
# pip inside the chroot would not see this host's pip configuration, local
# indexes or CA bundle; so the host's pip resolves and builds every wheel
# (same Python 3.11 ABI) and the chroot installs offline from them.
build_wheelhouse() {
    [ -f "$WHEELHOUSE/.complete" ] && return 0
    local tmp=$WHEELHOUSE.tmp
    rm -rf "$tmp"; mkdir -p "$tmp"
    (cd "$REPO" && "$PY" -m pip wheel --quiet --wheel-dir "$tmp" \
        -c constraints.txt -r requirements.txt -r test-requirements.txt \
        -r tools/testbed/stack-requirements.txt) || return 1
    touch "$tmp/.complete"
    mv -T "$tmp" "$WHEELHOUSE"
}
build_wheelhouse >"$LOGDIR/wheelhouse.log" 2>&1 &
WH_PID=$!

# ---- 2. debootstrap ----
INCLUDE=$(IFS=,; echo "${PACKAGES[*]}")
if ! debootstrap --variant=minbase --include="$INCLUDE" --cache-dir="$CACHE/debs" \
        "$SUITE" "$BUILD" "$MIRROR" >"$LOGDIR/debootstrap.log" 2>&1; then
    show_log_tail "$LOGDIR/debootstrap.log"
    [ -f "$BUILD/debootstrap/debootstrap.log" ] && show_log_tail "$BUILD/debootstrap/debootstrap.log"
    kill "$WH_PID" 2>/dev/null || true
    die "debootstrap failed"
fi
log "debootstrap done (${#PACKAGES[@]} packages requested)"

if ! wait "$WH_PID"; then
    show_log_tail "$LOGDIR/wheelhouse.log"
    die "building the wheelhouse failed"
fi
log "wheelhouse ready: $WHEELHOUSE ($(ls "$WHEELHOUSE" | grep -c '\.whl$') wheels)"

# Commands in the chroot get a clean environment: the host's PIP_*, proxy and
# CA variables point at host paths.
in_chroot() {
    env -i HOME=/root LANG=C.UTF-8 PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        chroot "$BUILD" "$@"
}

GUEST_PY=$(in_chroot python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
[ "$GUEST_PY" = 3.11 ] || die "guest python is $GUEST_PY, the wheelhouse is for 3.11"

# ---- 3. venv with the project's requirements (offline, from the wheelhouse) ----
mkdir -p "$BUILD/tmp/wheelhouse" "$BUILD/tmp/req"
cp "$WHEELHOUSE"/*.whl "$BUILD/tmp/wheelhouse/"
(cd "$REPO" && cp "${REQ_FILES[@]}" "$BUILD/tmp/req/")
in_chroot python3 -m venv "$VENV"
if ! in_chroot "$VENV/bin/python" -m pip install --no-index --find-links /tmp/wheelhouse \
        --no-cache-dir --disable-pip-version-check --quiet \
        -c /tmp/req/constraints.txt -r /tmp/req/requirements.txt \
        -r /tmp/req/test-requirements.txt -r /tmp/req/stack-requirements.txt \
        >"$LOGDIR/venv.log" 2>&1; then
    show_log_tail "$LOGDIR/venv.log"
    die "pip install in the guest venv failed"
fi
rm -rf "$BUILD/tmp/wheelhouse" "$BUILD/tmp/req"
log "venv $VENV ready ($(in_chroot "$VENV/bin/python" -m pip list 2>/dev/null | wc -l) packages)"

# ---- 4. kernel modules of the UML kernel ----
mkdir -p "$BUILD/lib/modules"
cp -a "/usr/lib/uml/modules/$KVER" "$BUILD/lib/modules/"
for m in overlay loop dm-mod dm-clone dm-snapshot dm-thin-pool configfs target_core_mod \
         iscsi_target_mod target_core_iblock iscsi_tcp sd_mod veth; do
    in_chroot modprobe -S "$KVER" --show-depends "$m" >/dev/null || die "module $m missing"
done

# ---- 5. testbed plumbing ----
install -m 0755 "$HERE/stage0" "$BUILD/sbin/testbed-stage0"
# mount points used by stage0 and the guest init (the rootfs is read-only
# at run time, so they must exist beforehand)
mkdir -p "$BUILD/testbed/rw" "$BUILD/testbed/run" "$BUILD/testbed/oldroot" "$BUILD/src"
: >"$BUILD/etc/resolv.conf"
echo testbed >"$BUILD/etc/hostname"

# ---- 6. trim ----
rm -rf "$BUILD"/usr/share/doc/* "$BUILD"/usr/share/man/* "$BUILD"/usr/share/info/* \
       "$BUILD"/usr/share/locale/* "$BUILD"/usr/share/lintian \
       "$BUILD"/var/cache/apt/*.bin "$BUILD"/var/cache/apt/archives/*.deb \
       "$BUILD"/var/lib/apt/lists/* "$BUILD"/root/.cache "$BUILD"/tmp/*
find "$BUILD/var/log" -type f -delete

# ---- 7. publish atomically ----
inputs_manifest >"$BUILD/$STAMP"
rm -rf --one-file-system "$ROOTFS"
mv -T "$BUILD" "$ROOTFS"
rm -rf "$LOGDIR"
prune
log "built $ROOTFS ($(du -sh "$ROOTFS" | cut -f1)) in $((SECONDS - T0)) s"
echo "$ROOTFS"
