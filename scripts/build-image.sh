#!/usr/bin/env bash
# Builds the image from the Dockerfile without a registry and without get.pulumi.com (`make image`):
#   1. a base image made from Debian's packages with mmdebstrap (python3.11 with venv, ca-certificates),
#      imported into podman; cached by its inputs (suite, packages, mirrors);
#   2. the Pulumi CLI and the Kubernetes provider plugin from .tools/bin (`make tools kube-tools`), given to the
#      Dockerfile as the build context `pulumi-tools`, which replaces its download stage;
#   3. `podman build` of the Dockerfile over that base (the virtual environment from PyPI, requirements.lock).
#
# Everything slow or large lives OUTSIDE the clone, shared by every checkout:
#   ${PROXY_OPERATOR_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/proxy-operator}/image/
# holding podman's storage (layers: a second build with the same lock reuses the venv layer), its config,
# the base rootfs tarball and the staged tools.
#
# usage: scripts/build-image.sh                 build localhost/proxy-operator:<version> (and :latest)
#        scripts/build-image.sh --oci-archive F also write the image as an OCI archive F (named
#                                              ghcr.io/example/proxy-operator:<version>, as deploy/ names it)
#        scripts/build-image.sh podman ARGS...   run podman with this storage and config (run, images, rmi...)
# PROXY_OPERATOR_IMAGE_REFRESH=1 rebuilds the base (Debian security updates) and the layers (--no-cache).
# Needs root (mmdebstrap, podman with runc); installs mmdebstrap, podman and runc from Debian when missing.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${PROXY_OPERATOR_CACHE_DIR:-${XDG_CACHE_HOME:-${HOME:?is not set: set PROXY_OPERATOR_CACHE_DIR}/.cache}/proxy-operator}/image"
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/pyproject.toml")"
image="localhost/proxy-operator"
# The name deploy/deployment.yaml runs and the kubernetes program's default proxy image
# (stacks/models/wire.py): tagged too, so a node that imports the archive needs no registry.
published="ghcr.io/example/proxy-operator"
suite=bookworm
packages=(python3.11 python3.11-venv ca-certificates openssh-client)
mirrors=(
  "deb http://deb.debian.org/debian $suite main"
  "deb http://deb.debian.org/debian $suite-updates main"
  "deb http://deb.debian.org/debian-security $suite-security main"
)
# Documentation, manual pages and translations stay out of the base (~30 MB).
dpkg_excludes=('/usr/share/doc/*' '/usr/share/man/*' '/usr/share/info/*' '/usr/share/locale/*' '/usr/share/lintian/*')

say() { printf '[image] %s\n' "$*"; }
die() { printf '[image] error: %s\n' "$*" >&2; exit 1; }

# podman's storage and config in the cache folder. The machine this was built on needs every setting here
# (docs/operations.md, "Install in a cluster"): crun refuses a hybrid cgroup layout; without CAP_SYS_RESOURCE
# podman's default ulimits (nofile 1048576) are refused; there is no systemd for cgroups or the journal.
setup_podman() {
  mkdir -p "$cache/storage" "$cache/run" "$cache/tmp"
  cat > "$cache/storage.conf" <<EOF
[storage]
driver = "overlay"
graphroot = "$cache/storage"
runroot = "$cache/run"
EOF
  cat > "$cache/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=4096:4096"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
  export CONTAINERS_STORAGE_CONF="$cache/storage.conf" CONTAINERS_CONF="$cache/containers.conf"
  export TMPDIR="$cache/tmp"  # buildah's cache mounts (pip's cache) and layer scratch space
}

need_programs() {
  local missing=() program
  for program in mmdebstrap podman runc; do command -v "$program" >/dev/null 2>&1 || missing+=("$program"); done
  ((${#missing[@]})) || return 0
  [ "$(id -u)" -eq 0 ] || die "missing ${missing[*]}: run  sudo apt-get install -y mmdebstrap podman runc uidmap"
  say "installing ${missing[*]} from Debian's packages"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mmdebstrap podman runc uidmap >/dev/null
}

base_image() {  # prints the tag of the base image, building and importing it when missing
  local key tag tar opts=() pattern scratch
  key="$(printf '%s\n' "$suite" "${packages[@]}" "${mirrors[@]}" "${dpkg_excludes[@]}" | sha256sum | cut -c1-12)"
  tag="localhost/proxy-operator-base:$suite-$key"
  tar="$cache/base-$suite-$key.tar"
  if [ -n "${PROXY_OPERATOR_IMAGE_REFRESH:-}" ]; then
    rm -f "$tar"; podman rmi -f "$tag" >/dev/null 2>&1 || true
  fi
  if podman image exists "$tag"; then
    say "base $tag is in place" >&2
  else
    if [ ! -f "$tar" ]; then
      say "making the base rootfs with mmdebstrap ($suite: ${packages[*]})" >&2
      for pattern in "${dpkg_excludes[@]}"; do opts+=("--dpkgopt=path-exclude=$pattern"); done
      # In /tmp, not the cache: apt downloads as the user _apt, who cannot enter /root (mode 0700).
      scratch="$(TMPDIR=/tmp mktemp -d)"
      TMPDIR=/tmp mmdebstrap --quiet --variant=minbase --include="$(IFS=,; echo "${packages[*]}")" "${opts[@]}" \
        "$suite" "$scratch/base.tar" "${mirrors[@]}" >&2 || die "mmdebstrap failed (are Debian's packages reachable?)"
      mv -f "$scratch/base.tar" "$tar"
      rmdir "$scratch"
    fi
    podman import --quiet "$tar" "$tag" >/dev/null
    say "imported $tar as $tag" >&2
  fi
  printf '%s\n' "$tag"
}

stage_tools() {  # prints the folder given as the `pulumi-tools` build context (binaries under out/)
  local bin="$root/.tools/bin" want stage name
  want="$(sed -n 's/^[[:space:]]*"pulumi==\([0-9.]*\)".*/\1/p' "$root/pyproject.toml")"
  [ "$("$bin/pulumi" version 2>/dev/null)" = "v$want" ] || die "no pulumi v$want in $bin: run make tools"
  [ -x "$bin/pulumi-resource-kubernetes" ] || die "no pulumi-resource-kubernetes in $bin: run make kube-tools"
  stage="$cache/tools/out"
  mkdir -p "$stage"
  for name in pulumi pulumi-resource-kubernetes; do
    # Copied (links into the cache would not survive the build context); skipped when unchanged, so the
    # layer that copies them stays cached.
    cmp -s "$bin/$name" "$stage/$name" || cp -L "$bin/$name" "$stage/$name"
  done
  say "tools: $(ls "$stage" | tr '\n' ' ')(from $bin)" >&2
  printf '%s\n' "$cache/tools"
}

arch() { case "$(uname -m)" in aarch64|arm64) echo arm64 ;; *) echo amd64 ;; esac; }

pip_cert() {  # the CA bundle this machine's pip uses, if it names one
  local cert="${PIP_CERT:-}"
  [ -n "$cert" ] || cert="$(python3 -m pip config get global.cert 2>/dev/null || true)"
  [ -z "$cert" ] || [ ! -f "$cert" ] || printf '%s\n' "$cert"
}

build() {
  local base tools started archive="${1:-}" no_cache=() secret=() cert
  [ -z "${PROXY_OPERATOR_IMAGE_REFRESH:-}" ] || no_cache=(--no-cache)
  started=$(date +%s)
  base="$(base_image)"
  tools="$(stage_tools)"
  say "building $image:$version from the Dockerfile over $base"
  # This machine's pip trusts a CA of its own (pip's `cert` setting): the build gets it as a secret.
  cert="$(pip_cert)"
  [ -z "$cert" ] || secret=(--secret "id=pip-cert,src=$cert")
  podman build --quiet --runtime runc --network host --layers "${no_cache[@]}" "${secret[@]}" \
    --build-arg "BASE_IMAGE=$base" --build-context "pulumi-tools=$tools" --build-arg "TARGETARCH=$(arch)" \
    --tag "$image:$version" --tag "$image:latest" --tag "$published:$version" --file "$root/Dockerfile" "$root" >/dev/null
  say "built $image:$version in $(( $(date +%s) - started )) s:" \
    "$(( $(podman image inspect --format '{{.Size}}' "$image:$version") / 1048576 )) MiB"
  if [ -n "$archive" ]; then
    podman save --quiet --format oci-archive --output "$archive.part" "$published:$version"
    mv -f "$archive.part" "$archive"
    say "wrote $archive ($(du -m "$archive" | cut -f1) MiB)"
  fi
  say "run it: bash scripts/build-image.sh podman run --rm --read-only $image:$version --help"
}

setup_podman
case "${1:-}" in
  podman) shift; exec podman "$@" ;;
  --oci-archive) [ -n "${2:-}" ] || die "--oci-archive needs a file name"; need_programs; build "$2" ;;
  "") need_programs; build ;;
  *) die "usage: $0 [--oci-archive FILE] | podman ARGS..." ;;
esac
