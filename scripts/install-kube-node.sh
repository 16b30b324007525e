#!/usr/bin/env bash
# The programs of the single-node cluster that tests/kube/test_node.py starts (tests/kube/node.py):
#   kubelet, kube-controller-manager, kube-scheduler, kube-proxy, kubectl  at the version tools/kube-apiserver
#     requires (the same wrapper module and ldflags as kube-apiserver, scripts/install-kube.sh);
#   kube-router (NetworkPolicy enforcement), at the version below;
#   CoreDNS (cluster DNS) at the version tools/coredns requires, built from that wrapper module with only the
#     plugins the node's Corefile uses (its main.go's directives), not every plugin (cloud SDKs included).
# Each comes from its official release download first (dl.k8s.io, GitHub releases, checked against the
# published sha256) and is built with Go from the Go module proxy when that fails (as it does on the build
# machine: only package registries answer). Each binary is cached OUTSIDE the clone, keyed by version:
#   ${PROXY_OPERATOR_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/proxy-operator}/<name>-<version>/
# and .tools/bin/<name> links to it. CoreDNS's key also holds a hash of tools/coredns (main.go with its plugin
# list, go.mod, go.sum): coredns-<version>-<hash>/, so a change of plugins rebuilds. Its official release has
# every plugin, a superset of the list (the check only asks that each listed plugin is there).
# PROXY_OPERATOR_NO_BUILD_CACHE=1 neither reads nor writes that cache;
# PROXY_OPERATOR_NO_DOWNLOAD=1 skips the download attempts. Idempotent: with everything in place it only looks.
#
# kube-router is a TEST-ONLY part: v2.1.0 has reported security flaws. It enforces NetworkPolicy on the test
# node and nothing else; it is never put in an image, never named in deploy/, never shipped.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/cached-binary.sh
source "$root/scripts/cached-binary.sh"
wrapper="$root/tools/kube-apiserver"
bin="$root/.tools/bin"
k8s_version="$(sed -n 's/^require k8s\.io\/kubernetes \(v[0-9.]*\)$/\1/p' "$wrapper/go.mod")"
kube_router_version=v2.1.0  # TEST-ONLY (see above); the only /v2 version the Go module proxy lists
coredns_wrapper="$root/tools/coredns"  # go 1.26.0 in CoreDNS's go.mod: the machine's Go builds it
coredns_version="$(sed -n 's/^require github\.com\/coredns\/coredns \(v[0-9.]*\)$/\1/p' "$coredns_wrapper/go.mod")"
# the wrapper's plugin list (main.go's `var directives`, one quoted name a line), checked in the binary; the
# cache key's hash covers the wrapper's files (the plugin list and imports, go.mod, go.sum)
coredns_plugins="$(sed -n '/^var directives = \[\]string{$/,/^}$/ s/^[[:space:]]*"\([a-z0-9_]*\)",$/\1/p' \
  "$coredns_wrapper/main.go" | paste -sd' ' -)"
coredns_key="$(cat "$coredns_wrapper/main.go" "$coredns_wrapper/go.mod" "$coredns_wrapper/go.sum" | sha256sum | cut -c1-12)"
# the programs' names, and the main package each is built from
k8s_programs="kubelet kube-controller-manager kube-scheduler kube-proxy kubectl"

say() { printf '[kube-node] %s\n' "$*"; }
die() { printf '[kube-node] error: %s\n' "$*" >&2; exit 1; }

[ -n "$k8s_version" ] || die "cannot read the k8s.io/kubernetes version from $wrapper/go.mod"
[ -n "$coredns_version" ] || die "cannot read the github.com/coredns/coredns version from $coredns_wrapper/go.mod"
[ -n "$coredns_plugins" ] || die "cannot read the plugin list (var directives) from $coredns_wrapper/main.go"
case "$(uname -m)" in x86_64) arch=amd64 ;; aarch64|arm64) arch=arm64 ;; *) arch="" ;; esac

# Globals install_cached reads: name, version, cache; and is_wanted BINARY.
stamp_of() { printf '%s %s\n' "$version" "$(sha256sum "$1" | cut -d' ' -f1)"; }
is_wanted() {
  [ -x "$1" ] || return 1
  case "$name" in
    # (the whole output first: `| grep -q` would stop reading early, and pipefail would see kubectl's SIGPIPE)
    kubectl) [[ "$("$1" version --client 2>/dev/null)" == *"Client Version: $version"* ]] ;;
    kube-router) [ -f "$1.version" ] && [ "$(cat "$1.version")" = "$(stamp_of "$1")" ] ;;  # no version flag: a stamp
    kube-*|kubelet) [ "$("$1" --version 2>/dev/null)" = "Kubernetes $version" ] ;;
    coredns) [[ "$("$1" -version 2>/dev/null)" == *"CoreDNS-${version#v}"* ]] && has_plugins "$1" ;;
    *) return 1 ;;
  esac
}
has_plugins() {  # has_plugins COREDNS: every plugin of the wrapper's list is in `coredns -plugins`
  local listed plugin
  listed="$("$1" -plugins 2>/dev/null)" || return 1
  for plugin in $coredns_plugins; do grep -qxF "$plugin" <<<"$listed" || return 1; done
}
finish() {  # finish TMP OUT INFO HOW: stamp, check, move in place, record how it came
  stamp_of "$1" > "$1.version"
  is_wanted "$1" || die "the $name made at $1 is not $name $version"
  mv -f "$1" "$2"
  mv -f "$1.version" "$2.version"
  printf '%s %s %s on %s\n' "$name" "$version" "$4" "$(date -u +%FT%TZ)" > "$3"
}

fetch() {  # fetch URL OUT: the file and its published sha256 (URL.sha256 or a checksums file); 1 on failure
  local url="$1" out="$2" sums="${3:-$1.sha256}" want
  [ -z "${PROXY_OPERATOR_NO_DOWNLOAD:-}" ] || return 1
  [ -n "$arch" ] && command -v curl >/dev/null 2>&1 || return 1
  say "trying the official release: $url"
  curl -fsSL --connect-timeout 5 --max-time 300 "$url" -o "$out" 2>/dev/null || return 1
  want="$(curl -fsSL --connect-timeout 5 --max-time 30 "$sums" 2>/dev/null |
    awk -v f="$(basename "$url")" 'NF == 1 || $2 == f || $2 == "*" f { print $1; exit }')" || return 1
  [ -n "$want" ] && [ "$(sha256sum "$out" | cut -d' ' -f1)" = "$want" ] || { say "checksum mismatch: $url"; return 1; }
}

gobuild() {  # gobuild OUT INFO DIR GO-BUILD-ARGS...: go build in DIR, timed, into OUT
  local out="$1" info="$2" dir="$3" started
  shift 3
  command -v go >/dev/null 2>&1 || die "the release download failed and there is no Go toolchain to build $name $version"
  say "building $name $version with $(go version | cut -d' ' -f3) from the Go module proxy (minutes)"
  started=$(date +%s)
  mkdir -p "$(dirname "$out")"
  (cd "$dir" && go build -trimpath -o "$out.tmp" "$@") ||
    die "go build of $name failed (is the Go module proxy reachable? GOPROXY=$(go env GOPROXY))"
  finish "$out.tmp" "$out" "$info" "built in $(( $(date +%s) - started ))s with $(go version | cut -d' ' -f3)"
  say "built $name in $(( $(date +%s) - started ))s: $(du -h "$out" | cut -f1)"
}

obtain_k8s() {  # a Kubernetes program: dl.k8s.io, else the wrapper module with kube-apiserver's ldflags
  local out="$1" info="$2"
  if fetch "https://dl.k8s.io/release/$version/bin/linux/$arch/$name" "$out.tmp"; then
    chmod +x "$out.tmp" && finish "$out.tmp" "$out" "$info" "downloaded from dl.k8s.io" && return 0
  fi
  rm -f "$out.tmp"
  gobuild "$out" "$info" "$wrapper" \
    -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(cut -d. -f2 <<<"$version")" \
    "k8s.io/kubernetes/cmd/$name"
}

obtain_release_tar() {  # obtain_release_tar OUT INFO URL SUMS: a GitHub release tarball holding $name
  local out="$1" info="$2" url="$3" sums="$4" tmp
  tmp="$(mktemp -d)"
  if fetch "$url" "$tmp/a.tgz" "$sums" && tar -xzf "$tmp/a.tgz" -C "$tmp" "$name" 2>/dev/null; then
    mkdir -p "$(dirname "$out")" && mv -f "$tmp/$name" "$out.tmp" && rm -rf "$tmp"
    finish "$out.tmp" "$out" "$info" "downloaded from $url" && return 0
  fi
  rm -rf "$tmp"
  return 1
}

goinstall() {  # goinstall OUT INFO PACKAGE@VERSION GO-FLAGS...: `go install` (the module's own go.mod) into OUT
  local out="$1" info="$2" package="$3" started gobin
  shift 3
  command -v go >/dev/null 2>&1 || die "the release download failed and there is no Go toolchain to build $name $version"
  say "building $name $version with $(go version | cut -d' ' -f3): go install $package (minutes)"
  started=$(date +%s)
  gobin="$(mktemp -d)"
  GOBIN="$gobin" go install -trimpath "$@" "$package" ||
    { rm -rf "$gobin"; die "go install $package failed (is the Go module proxy reachable? GOPROXY=$(go env GOPROXY))"; }
  mkdir -p "$(dirname "$out")"
  mv -f "$gobin/$name" "$out.tmp" && rm -rf "$gobin"
  finish "$out.tmp" "$out" "$info" "built in $(( $(date +%s) - started ))s with $(go version | cut -d' ' -f3)"
  say "built $name in $(( $(date +%s) - started ))s: $(du -h "$out" | cut -f1)"
}

obtain_kube_router() {  # TEST-ONLY (see the top)
  local out="$1" info="$2" v="${version#v}"
  obtain_release_tar "$out" "$info" \
    "https://github.com/cloudnativelabs/kube-router/releases/download/$version/kube-router_${v}_linux_$arch.tar.gz" \
    "https://github.com/cloudnativelabs/kube-router/releases/download/$version/kube-router_${v}_checksums.txt" && return 0
  goinstall "$out" "$info" "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router@$version" \
    -ldflags "-s -w -X github.com/cloudnativelabs/kube-router/v2/pkg/version.Version=$version"
}

obtain_coredns() {
  local out="$1" info="$2" v="${version#v}"
  obtain_release_tar "$out" "$info" \
    "https://github.com/coredns/coredns/releases/download/$version/coredns_${v}_linux_$arch.tgz" \
    "https://github.com/coredns/coredns/releases/download/$version/coredns_${v}_linux_$arch.tgz.sha256" && return 0
  # the wrapper module: CoreDNS's main with only the plugins of main.go's directives
  CGO_ENABLED=0 gobuild "$out" "$info" "$coredns_wrapper" -ldflags "-s -w" .
  printf 'plugins: %s\n' "$coredns_plugins" >> "$info"
}

install_one() {  # install_one NAME VERSION OBTAIN
  name="$1" version="$2"
  cache="$(cache_dir "$name-$version")"
  install_cached "$name" "$3" .version
}

for program in ${KUBE_NODE_ONLY:-$k8s_programs kube-router coredns}; do
  case "$program" in
    kube-router) install_one kube-router "$kube_router_version" obtain_kube_router ;;
    coredns)  # the cache folder coredns-<version>-<hash of tools/coredns>
      name=coredns version="$coredns_version"
      cache="$(cache_dir "coredns-$coredns_version-$coredns_key")"
      install_cached coredns obtain_coredns .version ;;
    *) install_one "$program" "$k8s_version" obtain_k8s ;;
  esac
done
