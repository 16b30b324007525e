#!/usr/bin/env bash
# The Kubernetes provider plugin, pulumi-resource-kubernetes, at the version pyproject.toml pins the
# pulumi-kubernetes SDK to (the SDK asks the engine for exactly that version). Pulumi's plugin download first;
# where it is out of reach (as here: only package registries answer) it is built with Go from the Go module
# proxy through the wrapper module tools/pulumi-kubernetes (minutes, ~5 GB of memory at the link).
#
# The binary is cached OUTSIDE the clone, keyed by version, the way scripts/install-kube.sh caches
# kube-apiserver:
#   ${PROXY_OPERATOR_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/proxy-operator}/pulumi-resource-kubernetes-v<version>/
# and .tools/bin/pulumi-resource-kubernetes links to it. .tools/bin is where the engine finds it in every
# setting: the engine puts the CLI's folder first on PATH and the CLI uses a provider plugin found on PATH,
# so neither a fresh PULUMI_HOME per test run nor a pod's emptyDir home needs it installed.
# PROXY_OPERATOR_NO_BUILD_CACHE=1 neither reads nor writes that cache: the binary goes into .tools/bin.
# PROXY_OPERATOR_NO_PLUGIN_DOWNLOAD=1 skips the download attempt (straight to the Go build).
# Idempotent: with everything in place it only looks. At the end it says which plugins it cannot provide.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/cached-binary.sh
source "$root/scripts/cached-binary.sh"
wrapper="$root/tools/pulumi-kubernetes"
bin="$root/.tools/bin"
name="pulumi-resource-kubernetes"
version="$(sed -n 's/^[[:space:]]*"pulumi-kubernetes==\([0-9.]*\)".*/\1/p' "$root/pyproject.toml")"
cache="$(cache_dir "$name-v$version")"

say() { printf '[k8s-plugin] %s\n' "$*"; }
die() { printf '[k8s-plugin] error: %s\n' "$*" >&2; exit 1; }

[ -n "$version" ] || die "cannot read the pinned pulumi-kubernetes version (==X.Y.Z) from pyproject.toml"
grep -qE "github.com/pulumi/pulumi-kubernetes/sdk/v4 v$version( |\$)" "$wrapper/go.mod" ||
  die "tools/pulumi-kubernetes/go.mod does not require sdk/v4 v$version: bump it together with pyproject.toml"

# A binary is the wanted one when the stamp beside it names this version and its checksum (the plugin has no
# --version flag; tests/kube/test_k8s_plugin.py asks the running plugin itself).
stamp_of() { printf '%s %s\n' "$version" "$(sha256sum "$1" | cut -d' ' -f1)"; }
is_wanted() {  # is_wanted BINARY
  [ -x "$1" ] && [ -f "$1.version" ] && [ "$(cat "$1.version")" = "$(stamp_of "$1")" ]
}
finish() {  # finish TMP OUT INFO HOW: move a verified binary in place, stamp it, record how it came
  mv -f "$1" "$2"
  stamp_of "$2" > "$2.version"
  printf '%s v%s %s on %s\n' "$name" "$version" "$4" "$(date -u +%FT%TZ)" > "$3"
}

download() {  # download OUT INFO: Pulumi's release of the plugin; 1 when out of reach
  local out="$1" arch tmp url
  [ -z "${PROXY_OPERATOR_NO_PLUGIN_DOWNLOAD:-}" ] || { say "download skipped (PROXY_OPERATOR_NO_PLUGIN_DOWNLOAD)"; return 1; }
  command -v curl >/dev/null 2>&1 || return 1
  case "$(uname -m)" in x86_64) arch=amd64 ;; aarch64|arm64) arch=arm64 ;; *) return 1 ;; esac
  tmp="$(mktemp -d)"
  for url in "https://get.pulumi.com/releases/plugins/$name-v$version-linux-$arch.tar.gz" \
             "https://github.com/pulumi/pulumi-kubernetes/releases/download/v$version/$name-v$version-linux-$arch.tar.gz"; do
    say "trying the official plugin: $url"
    if curl -fsSL --connect-timeout 5 --max-time 300 "$url" -o "$tmp/plugin.tgz" 2>/dev/null &&
       tar -xzf "$tmp/plugin.tgz" -C "$tmp" "$name" 2>/dev/null && [ -x "$tmp/$name" ]; then
      mkdir -p "$(dirname "$out")"
      mv -f "$tmp/$name" "$out.tmp"
      rm -rf "$tmp"
      finish "$out.tmp" "$out" "$2" "downloaded from $url"
      say "downloaded $name v$version"
      return 0
    fi
  done
  rm -rf "$tmp"
  say "the official plugin is out of reach: building it with Go"
  return 1
}

build() {  # build OUT INFO: go build from the wrapper module, in a scratch copy (the clone is not written)
  local out="$1" started go_min provider_dir work
  go_min="$(sed -n 's/^go //p' "$wrapper/go.mod")"
  command -v go >/dev/null 2>&1 ||
    die "the official plugin is out of reach and there is no Go toolchain to build $name v$version: install Go >= $go_min (the go line of tools/pulumi-kubernetes/go.mod) or allow access to get.pulumi.com"
  started=$(date +%s)
  say "building $name v$version with $(go version | cut -d' ' -f3) from the Go module proxy"
  say "(a cold build takes ~8 minutes on 2 cores and peaks near 5 GB; later builds reuse Go's caches)"
  provider_dir="$(cd "$wrapper" && go mod download -json github.com/pulumi/pulumi-kubernetes/provider/v4 |
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  [ -d "$provider_dir/cmd/$name" ] || die "go mod download of the provider module failed (GOPROXY=$(go env GOPROXY))"
  cmp -s "$provider_dir/cmd/$name/main.go" "$wrapper/cmd/$name/main.go" ||
    die "tools/pulumi-kubernetes/cmd/$name/main.go differs from the provider module's: copy it again"
  work="$(mktemp -d)"
  # shellcheck disable=SC2064  # expand now: $work is local
  trap "rm -rf '$work'" EXIT
  cp "$wrapper/go.mod" "$wrapper/go.sum" "$work/"
  mkdir -p "$work/cmd/$name"
  cp "$wrapper/cmd/$name/main.go" "$work/cmd/$name/"
  cp "$provider_dir/cmd/$name/generate.go" "$provider_dir/cmd/$name/schema.json" \
     "$provider_dir/cmd/$name/terraform-mapping.json" "$work/cmd/$name/"
  chmod -R u+w "$work"
  say "generating schema-embed.json and terraform-mapping-embed.json (upstream's go:generate step)"
  (cd "$work/cmd/$name" && VERSION="$version" go run generate.go) || die "generating the embedded files failed"
  rm -f "$work/cmd/$name/generate.go"
  say "compiling and linking (the slow part)"
  mkdir -p "$(dirname "$out")"
  (cd "$work" && CGO_ENABLED=0 go build -trimpath -o "$out.tmp" \
    -ldflags "-s -w -X github.com/pulumi/pulumi-kubernetes/provider/v4/pkg/version.Version=$version" \
    "./cmd/$name") || die "go build of $name failed (is the Go module proxy reachable? GOPROXY=$(go env GOPROXY))"
  rm -rf "$work"
  trap - EXIT
  finish "$out.tmp" "$out" "$2" "built in $(( $(date +%s) - started ))s with $(go version | cut -d' ' -f3)"
  say "built in $(( $(date +%s) - started ))s: $(du -h "$out" | cut -f1) at $out"
}

obtain() {  # obtain OUT INFO
  download "$@" || build "$@"
}

install_plugin() {
  install_cached "$name" obtain .version
}

not_provided() {
  say "not provided here: pulumi-resource-gcp. Pulumi's plugin downloads are out of reach from this machine"
  say "  and the Go module proxy refuses its provider module (403 for github.com/pulumi/pulumi-gcp/provider/v*)."
  say "  Here: gcp stacks cannot run up or preview (their program is tested under Pulumi mocks only); such a"
  say "  stack fails (the engine can neither find nor download the plugin) and says so on its Proxies; the"
  say "  local, kubernetes and kvm stacks go on (kvm needs no plugin: libvirt-python dynamic providers)."
  say "  With internet access: nothing to do; the Pulumi CLI downloads the missing plugin on first use into"
  say "  PULUMI_HOME/plugins (unless PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION is set), at the version"
  say "  the pulumi-gcp Python SDK in requirements.lock asks for."
}

install_plugin
not_provided
