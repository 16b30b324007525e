#!/usr/bin/env bash
# What the tests that run a real Kubernetes API server need (tests/kube): etcd, from Debian's etcd-server, and
# kube-apiserver at the version tools/kube-apiserver/go.mod requires, built with Go from that wrapper module
# (the Go module proxy serves every module it needs; no release binary is fetched).
#
# The build takes minutes and ~3 GB of memory, so the binary is cached OUTSIDE the clone, keyed by version:
#   ${PROXY_OPERATOR_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/proxy-operator}/kube-apiserver-<version>/
# and .tools/bin/kube-apiserver links to it: a fresh clone (or CI on the same machine) reuses it.
# PROXY_OPERATOR_NO_BUILD_CACHE=1 neither reads nor writes that cache: the binary is built into .tools/bin.
# Idempotent: with everything in place it only looks.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/cached-binary.sh
source "$root/scripts/cached-binary.sh"
wrapper="$root/tools/kube-apiserver"
bin="$root/.tools/bin"
version="$(sed -n 's/^require k8s\.io\/kubernetes \(v[0-9.]*\)$/\1/p' "$wrapper/go.mod")"
cache="$(cache_dir "kube-apiserver-$version")"

say() { printf '[kube] %s\n' "$*"; }
die() { printf '[kube] error: %s\n' "$*" >&2; exit 1; }

[ -n "$version" ] || die "cannot read the k8s.io/kubernetes version from $wrapper/go.mod"

# --- etcd -------------------------------------------------------------------------------------------------
install_etcd() {
  if command -v etcd >/dev/null 2>&1; then
    say "etcd is in place ($(etcd --version 2>/dev/null | head -1))"
    return 0
  fi
  local apt
  if [ "$(id -u)" -eq 0 ]; then
    apt=(apt-get)
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    apt=(sudo -n apt-get)
  else
    die "etcd is missing and this is not root: run  sudo apt-get install -y --no-install-recommends etcd-server  then make kube-tools again"
  fi
  command -v apt-get >/dev/null 2>&1 ||
    die "etcd is missing and there is no apt-get: install etcd >= 3.4 on PATH, then make kube-tools again"
  say "installing etcd (Debian package etcd-server) with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  if ! "${apt[@]}" install -y -qq --no-install-recommends etcd-server >/dev/null 2>&1; then
    "${apt[@]}" update -qq || die "apt-get update failed: install etcd-server by hand"
    "${apt[@]}" install -y -qq --no-install-recommends etcd-server >/dev/null ||
      die "apt-get install etcd-server failed (see above): install it by hand and run make kube-tools again"
  fi
  command -v etcd >/dev/null 2>&1 || die "etcd-server is installed but etcd is not on PATH"
  say "installed $(etcd --version 2>/dev/null | head -1)"
}

# --- kube-apiserver ---------------------------------------------------------------------------------------
is_wanted() {  # is_wanted BINARY: it runs and says it is $version
  [ -x "$1" ] && [ "$("$1" --version 2>/dev/null)" = "Kubernetes $version" ]
}

build() {  # build OUTPUT INFO: go build into OUTPUT.tmp, move it in place, say how it was built in INFO
  local out="$1" info="$2" started go_min
  go_min="$(sed -n 's/^go //p' "$wrapper/go.mod")"
  command -v go >/dev/null 2>&1 ||
    die "no Go toolchain to build kube-apiserver $version with: install Go >= $go_min (the go line of tools/kube-apiserver/go.mod)"
  say "building kube-apiserver $version with $(go version | cut -d' ' -f3) from the Go module proxy"
  say "(a cold build takes ~6 minutes on 2 cores and peaks near 3 GB; later builds reuse the cache)"
  started=$(date +%s)
  mkdir -p "$(dirname "$out")"
  (cd "$wrapper" && go build -trimpath -o "$out.tmp" \
    -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(cut -d. -f2 <<<"$version")" \
    k8s.io/kubernetes/cmd/kube-apiserver) ||
    die "go build of kube-apiserver failed (is the Go module proxy reachable? GOPROXY=$(go env GOPROXY))"
  is_wanted "$out.tmp" || die "the built $out.tmp does not say 'Kubernetes $version'"
  mv -f "$out.tmp" "$out"
  printf 'kube-apiserver %s built in %ss with %s on %s\n' "$version" "$(( $(date +%s) - started ))" \
    "$(go version | cut -d' ' -f3)" "$(date -u +%FT%TZ)" > "$info"
  say "built in $(( $(date +%s) - started ))s: $(du -h "$out" | cut -f1) at $out"
}

install_apiserver() {
  install_cached kube-apiserver build
}

install_etcd
install_apiserver
