#!/usr/bin/env bash
# The kvm provider's guest images, built offline from Debian's packages (`make kvm-image`):
#   1. a bookworm root filesystem with mmdebstrap: the cloud kernel, systemd, cloud-init (NoCloud only),
#      qemu-guest-agent, tinyproxy, dante with pam_pwdfile, nftables, ifupdown + dhclient; no network access
#      is needed at boot (the proxy setup finds every package installed);
#   2. per variant, a 2 GiB disk (one MBR partition, ext4, extlinux) converted to a compressed qcow2:
#      full  the systemd image: what docs/kvm-provider.md tells users to build;
#      fast  the same files booted by a small init (scripts/kvm-image/fast-init) instead of systemd, with a
#            `systemctl` for the init scripts and cloud-init's module lists cut to what the proxy setup
#            uses: for the tests, where guests run under TCG (no systemd, no udev, same interfaces).
#
# Both are cached OUTSIDE the clone, keyed by a hash of the recipe (this script and scripts/kvm-image/):
#   ${PROXY_OPERATOR_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/proxy-operator}/kvm-image-<hash>/image.qcow2
# and reused when present (the root filesystem too: kvm-image-rootfs-<hash>/rootfs.tar).
#
# usage: scripts/build-kvm-image.sh [full|fast]   build (or find) the image; prints its path last on stdout
# PROXY_OPERATOR_KVM_IMAGE_REFRESH=1 rebuilds both steps (Debian security updates).
# Needs root (mmdebstrap, a loop device, a mount in a private mount namespace) and the programs of
# `scripts/install-system-deps.sh kvm`.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
here="$root/scripts/kvm-image"
variant="${1:-full}"
base="${PROXY_OPERATOR_CACHE_DIR:-${XDG_CACHE_HOME:-${HOME:?is not set: set PROXY_OPERATOR_CACHE_DIR}/.cache}/proxy-operator}"
suite=bookworm
packages=(linux-image-cloud-amd64 systemd-sysv udev cloud-init cloud-guest-utils qemu-guest-agent tinyproxy
  dante-server libpam-pwdfile nftables ifupdown isc-dhcp-client iproute2 openssl passwd adduser procps
  netbase ca-certificates)
mirrors=(
  "deb http://deb.debian.org/debian $suite main"
  "deb http://deb.debian.org/debian $suite-updates main"
  "deb http://deb.debian.org/debian-security $suite-security main"
)
dpkg_excludes=('/usr/share/doc/*' '/usr/share/man/*' '/usr/share/info/*' '/usr/share/locale/*' '/usr/share/lintian/*')
disk_mib=2048
label=kvmroot
rootfs_recipe=1  # part of the root filesystem's cache key: bump it when the mmdebstrap call changes

say() { printf '[kvm-image] %s\n' "$*" >&2; }
die() { printf '[kvm-image] error: %s\n' "$*" >&2; exit 1; }

case "$variant" in full|fast) ;; *) die "usage: $0 [full|fast]" ;; esac
[ "$(id -u)" -eq 0 ] || die "needs root (mmdebstrap, losetup, mount): run it as root"
for program in mmdebstrap extlinux sfdisk mkfs.ext4 losetup qemu-img unshare; do
  command -v "$program" >/dev/null 2>&1 || die "missing $program: run  bash scripts/install-system-deps.sh kvm"
done
mbr="${PROXY_OPERATOR_SYSLINUX_DIR:-/usr/lib/syslinux}/mbr/mbr.bin"
[ -e "$mbr" ] || die "missing $mbr: run  bash scripts/install-system-deps.sh kvm"

hash_of() {  # hash_of FILE... -- PART...: a cache key from files' contents and words
  local files=()
  while [ "$1" != -- ]; do files+=("$1"); shift; done
  shift
  { printf '%s\n' "$@"; cat "${files[@]}"; } | sha256sum | cut -c1-16
}

rootfs() {  # prints the path of the root filesystem tarball, building it when missing
  local dir tar key opts=() pattern
  # only what makes the tree: editing the variants' files does not rebuild it
  key="$(hash_of "$here/customize-rootfs" -- "$rootfs_recipe" "$suite" "${packages[@]}" "${mirrors[@]}" "${dpkg_excludes[@]}")"
  dir="$base/kvm-image-rootfs-$key"
  tar="$dir/rootfs.tar"
  if [ -s "$tar" ] && [ -z "${PROXY_OPERATOR_KVM_IMAGE_REFRESH:-}" ]; then
    say "reusing the root filesystem $tar"
    printf '%s\n' "$tar"
    return
  fi
  mkdir -p "$dir"
  for pattern in "${dpkg_excludes[@]}"; do opts+=("--dpkgopt=path-exclude=$pattern"); done
  say "building the root filesystem with mmdebstrap ($suite: ${packages[*]})"
  local started=$SECONDS
  mmdebstrap --variant=apt --format=tar --quiet --include="$(IFS=,; echo "${packages[*]}")" "${opts[@]}" \
    --customize-hook="bash '$here/customize-rootfs' \"\$1\" '$label'" \
    "$suite" "$tar.tmp" "${mirrors[@]}" >&2
  mv -f "$tar.tmp" "$tar"
  say "root filesystem built in $((SECONDS - started)) s ($(du -m "$tar" | cut -f1) MiB)"
  printf '%s\n' "$tar"
}

work="" loop=""
cleanup() {
  [ -z "$loop" ] || losetup -d "$loop" 2>/dev/null || true
  [ -z "$work" ] || rm -rf "$work"
}
trap cleanup EXIT

assemble() {  # assemble TARBALL OUT: the bootable qcow2 of this variant
  local tar="$1" out="$2" kernel initrd append
  work="$(mktemp -d "$base/kvm-image-work.XXXXXX")"
  mkdir "$work/tree" "$work/mnt"
  tar --numeric-owner -xpf "$tar" -C "$work/tree"
  [ "$variant" = fast ] && bash "$here/customize-fast" "$work/tree"
  kernel="$(cd "$work/tree" && ls boot/vmlinuz-* | sort -V | tail -n1)"
  initrd="$(cd "$work/tree" && ls boot/initrd.img-* | sort -V | tail -n1)"
  append="root=LABEL=$label ro console=tty0 console=ttyS0,115200n8"
  [ "$variant" = fast ] && append="$append quiet init=/usr/local/sbin/proxy-operator-fast-init"
  mkdir -p "$work/tree/boot/extlinux"
  printf 'DEFAULT linux\nPROMPT 0\nTIMEOUT 0\nLABEL linux\n  LINUX /%s\n  INITRD /%s\n  APPEND %s\n' \
    "$kernel" "$initrd" "$append" > "$work/tree/boot/extlinux/extlinux.conf"
  truncate -s "${disk_mib}M" "$work/disk.raw"
  printf 'label: dos\nstart=2048, type=83, bootable\n' | sfdisk --quiet "$work/disk.raw"
  dd if="$mbr" of="$work/disk.raw" bs=440 count=1 conv=notrunc status=none
  # The partition through a loop device of its own (no partition scan: no udev needed), formatted from the
  # tree, and extlinux installed in a mount that only a private mount namespace sees.
  loop="$(losetup --find --show --offset $((1024 * 1024)) --sizelimit $(((disk_mib - 1) * 1024 * 1024)) "$work/disk.raw")"
  mkfs.ext4 -q -L "$label" -O ^64bit,^metadata_csum,^orphan_file -d "$work/tree" "$loop"
  unshare --mount --propagation private sh -ec \
    'mount "$1" "$2"; extlinux --install "$2/boot/extlinux" >/dev/null; umount "$2"' sh "$loop" "$work/mnt"
  losetup -d "$loop"
  loop=""
  qemu-img convert -c -O qcow2 "$work/disk.raw" "$out"
}

mapfile -t recipe < <(find "$here" -type f | sort)
key="$(hash_of "${BASH_SOURCE[0]}" "${recipe[@]}" -- "$variant")"
dir="$base/kvm-image-$key"
image="$dir/image.qcow2"
mkdir -p "$base"
exec 9>"$base/kvm-image.lock"
flock 9  # another clone building: wait for it and reuse what it made
if [ -s "$image" ] && [ -z "${PROXY_OPERATOR_KVM_IMAGE_REFRESH:-}" ]; then
  say "reusing the $variant image $image"
  printf '%s\n' "$image"
  exit 0
fi
started=$SECONDS
tarball="$(rootfs)"
say "assembling the $variant image"
mkdir -p "$dir"
assemble "$tarball" "$dir/image.qcow2.tmp"
mv -f "$dir/image.qcow2.tmp" "$image"
printf 'variant %s\nsuite %s\npackages %s\nbuilt %s in %s s\n' "$variant" "$suite" "${packages[*]}" \
  "$(date -u +%FT%TZ)" "$((SECONDS - started))" > "$dir/build-info.txt"
say "$variant image built in $((SECONDS - started)) s: $image ($(du -m "$image" | cut -f1) MiB)"
printf '%s\n' "$image"
