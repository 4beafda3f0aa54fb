#!/bin/bash
# Build (or reuse) the kernel side of the QEMU backend and print its dir.
#
# Debian's amd64 kernel has no dm-clone (CONFIG_DM_CLONE unset), so this
# builds dm-clone.ko out of tree from Debian's linux-source against the
# matching linux-headers, next to the unpacked linux-image of the same ABI
# (pinned together: the headers, source and image versions must match).
#
# Output: ${DMCLONE_TESTBED_CACHE:-/var/cache/cinder-dmclone/testbed}/qemu-kernel-<hash>/
#   vmlinuz             the kernel
#   lib/modules/<abi>/  its module tree plus updates/dm-clone.ko, depmod'ed;
#                       the guest mounts it at /lib/modules/<abi> (9p)
#   initrd.cpio         busybox, the 9p/virtio/overlay modules and
#                       qemu-stage0 as /init (see that file)
#   .complete           written last
# <hash> covers this script, qemu-stage0 and the kernel package version.
#
# Usage: tools/testbed/build-qemu-kernel.sh      (stdout: the directory)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${DMCLONE_TESTBED_CACHE:-/var/cache/cinder-dmclone/testbed}
T0=$SECONDS
log() { printf 'build-qemu-kernel [%4ds] %s\n' $((SECONDS - T0)) "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
[ "$(id -u)" -eq 0 ] || die "must run as root"
export DEBIAN_FRONTEND=noninteractive

# The kernel ABI the archive's linux-image-amd64 points at, and its version.
resolve_kernel() {
    ABI=$(apt-cache depends linux-image-amd64 2>/dev/null |
          sed -n 's/.*Depends: linux-image-//p' | head -n 1)
    [ -n "$ABI" ] && KPKGVER=$(apt-cache show "linux-image-$ABI" 2>/dev/null |
                                sed -n 's/^Version: //p' | head -n 1)
    [ -n "$ABI" ] && [ -n "${KPKGVER:-}" ]
}
if ! resolve_kernel; then
    apt-get update -q >&2
    resolve_kernel || die "cannot resolve linux-image-amd64's kernel ABI"
fi
KSERIES=${ABI%%.0-*}            # 6.1

mkdir -p "$CACHE"
# The runner holds the cache lock already and hands us its descriptor.
if [ -z "${DMCLONE_TESTBED_LOCK_FD:-}" ]; then
    exec {lock_fd}>"$CACHE/lock"
    flock -n "$lock_fd" || { log "waiting for $CACHE/lock"; flock "$lock_fd"; }
fi

HASH=$( (cd "$HERE" && sha256sum build-qemu-kernel.sh qemu-stage0; echo "$ABI $KPKGVER") |
        sha256sum | cut -c1-16)
OUT=$CACHE/qemu-kernel-$HASH
if [ -f "$OUT/.complete" ]; then
    log "reusing $OUT"
    echo "$OUT"
    exit 0
fi

# ---- host packages (idempotent) ----
PKGS=(qemu-system-x86 busybox-static cpio xz-utils gcc make libc6-dev kmod
      "linux-headers-$ABI" "linux-source-$KSERIES")
missing=()
for p in "${PKGS[@]}"; do
    [[ $(dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null || true) == ii* ]] || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    log "installing ${missing[*]}"
    apt-get install -y -q --no-install-recommends \
        "${PKGS[@]/#linux-source-$KSERIES/linux-source-$KSERIES=$KPKGVER}" >"$CACHE/apt.log" 2>&1 ||
        { tail -n 20 "$CACHE/apt.log" >&2; die "apt-get install failed"; }
fi
HDRVER=$(dpkg-query -W -f='${Version}' "linux-headers-$ABI")
SRCVER=$(dpkg-query -W -f='${Version}' "linux-source-$KSERIES")
[ "$HDRVER" = "$KPKGVER" ] && [ "$SRCVER" = "$KPKGVER" ] ||
    die "version skew: image $KPKGVER, headers $HDRVER, source $SRCVER"

TMP=$OUT.tmp
rm -rf "$TMP"; mkdir -p "$TMP"
trap 'rm -rf "$TMP/work"' EXIT
W=$TMP/work; mkdir -p "$W"

# ---- kernel image and modules ----
log "fetching linux-image-$ABI $KPKGVER"
(cd "$W" && apt-get download -q -o APT::Sandbox::User=root "linux-image-$ABI=$KPKGVER" >&2)
dpkg-deb -x "$W"/linux-image-"$ABI"_*.deb "$W/image"
cp "$W/image/boot/vmlinuz-$ABI" "$TMP/vmlinuz"
mkdir -p "$TMP/lib/modules"
mv "$W/image/lib/modules/$ABI" "$TMP/lib/modules/$ABI"

# ---- dm-clone.ko, out of tree ----
log "building dm-clone.ko"
tar -xJf "/usr/src/linux-source-$KSERIES.tar.xz" -C "$W" --wildcards '*/drivers/md/*'
MD=$(echo "$W"/linux-source-*/drivers/md)
mkdir -p "$W/dmclone"
cp "$MD"/dm-clone-*.c "$MD"/*.h "$W/dmclone/"
cp -r "$MD/persistent-data" "$W/dmclone/"
printf 'obj-m := dm-clone.o\ndm-clone-y := dm-clone-target.o dm-clone-metadata.o\n' >"$W/dmclone/Kbuild"
make -C "/lib/modules/$ABI/build" M="$W/dmclone" modules >"$W/dmclone.log" 2>&1 ||
    { tail -n 30 "$W/dmclone.log" >&2; die "dm-clone.ko build failed"; }
mkdir -p "$TMP/lib/modules/$ABI/updates"
cp "$W/dmclone/dm-clone.ko" "$TMP/lib/modules/$ABI/updates/"
depmod -b "$TMP" "$ABI"
modprobe -d "$TMP" -S "$ABI" --show-depends dm-clone >/dev/null || die "dm-clone deps"

# ---- initramfs: busybox + what mounting the 9p root needs ----
log "building the initramfs"
I=$W/initrd
mkdir -p "$I/bin" "$I/lib/modules"
cp /bin/busybox "$I/bin/busybox"
for m in virtio_pci 9pnet_virtio 9p overlay; do
    modprobe -d "$TMP" -S "$ABI" --show-depends "$m" | awk '$1 == "insmod" { print $2 }'
done | awk '!seen[$0]++' >"$W/load.list"
while read -r ko; do
    rel=${ko#"$TMP"/lib/modules/}
    mkdir -p "$I/lib/modules/$(dirname "$rel")"
    cp "$ko" "$I/lib/modules/$rel"
    echo "/lib/modules/$rel"
done <"$W/load.list" >"$I/modules.load"
install -m 0755 "$HERE/qemu-stage0" "$I/init"
(cd "$I" && find . -print0 | cpio --null -o -H newc --quiet) >"$TMP/initrd.cpio"

rm -rf "$W"
touch "$TMP/.complete"
rm -rf "$OUT"
mv -T "$TMP" "$OUT"
for d in "$CACHE"/qemu-kernel-*; do
    [ "$d" = "$OUT" ] || { log "pruning $d"; rm -rf "$d"; }
done
log "built $OUT ($ABI, $KPKGVER) in $((SECONDS - T0)) s"
echo "$OUT"
