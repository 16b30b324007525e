#!/usr/bin/env bash
# Installs the Pulumi CLI and the Python language host under .tools/bin, at the version of the pulumi SDK that
# pyproject.toml pins. Official release bundle when reachable; otherwise the CLI is built with Go from the Go
# module proxy (wrapper module in tools/pulumi-cli) and the language host is the SDK-backed adapter that the
# package ships (automation/engine/langhost.py; the Go language host's module is not served by the proxy).
# Idempotent: a second run with everything in place does nothing.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
version="$(sed -n 's/^[[:space:]]*"pulumi==\([0-9.]*\)".*/\1/p' "$root/pyproject.toml")"
tools="$root/.tools"
bin="$tools/bin"
wrapper="$root/tools/pulumi-cli"
launchers=(pulumi-language-python pulumi-resource-pulumi-python)

say() { printf '[tools] %s\n' "$*"; }
die() { printf '[tools] error: %s\n' "$*" >&2; exit 1; }

[ -n "$version" ] || die "cannot read the pinned pulumi version from pyproject.toml"
grep -qE "github.com/pulumi/pulumi/pkg/v3 v$version( |\$)" "$wrapper/go.mod" ||
  die "tools/pulumi-cli/go.mod does not require pkg/v3 v$version: bump it together with pyproject.toml"

up_to_date() {
  [ -x "$bin/pulumi" ] || return 1
  for l in "${launchers[@]}"; do [ -x "$bin/$l" ] || return 1; done
  [ "$("$bin/pulumi" version 2>/dev/null)" = "v$version" ]
}

# The checkout's launchers of the package's plugins: the language host (not over the official bundle's Go
# host) and the dynamic provider (over the SDK's shell launcher, which runs Python as the child of a waiting
# shell: a SIGKILLed CLI left both running; ours execs, and the plugin dies with the CLI). Rewritten when
# they differ, so a .tools/ made before a launcher moved into the package is mended without a rebuild.
write_launcher() {
  local name="$1" module="$2" flags="$3" target="$bin/$1" want
  want="#!/bin/sh
# $name for Pulumi v$version, shipped in the package: see ${module//.//}.py.
exec \"\${PULUMI_PYTHON_CMD:-$root/.venv/bin/python}\" $flags-m $module \"\$@\""
  [ "$(cat "$target" 2>/dev/null)" = "$want" ] && return 0
  mkdir -p "$bin"
  printf '%s\n' "$want" > "$target"
  chmod 0755 "$target"
  say "installed $name (launcher of $module)"
}

package_launchers() {
  # The official bundle's Go language host stays when it is there (not a script).
  if ! [ -e "$bin/pulumi-language-python" ] || [ "$(head -c2 "$bin/pulumi-language-python")" = "#!" ]; then
    write_launcher pulumi-language-python automation.engine.langhost ""
  fi
  write_launcher pulumi-resource-pulumi-python automation.dynamic_provider "-u "
}

[ -x "$bin/pulumi" ] && package_launchers
if up_to_date; then
  say "pulumi v$version and its Python launchers are in place ($bin); nothing to do"
  exit 0
fi
mkdir -p "$bin"
started=$(date +%s)

install_release() {
  local url="https://get.pulumi.com/releases/sdk/pulumi-v$version-linux-x64.tar.gz" tmp
  command -v curl >/dev/null || return 1
  say "trying the official release bundle"
  tmp="$(mktemp -d)"
  if ! curl -fsSL --connect-timeout 5 --max-time 300 "$url" -o "$tmp/pulumi.tgz" 2>/dev/null; then
    rm -rf "$tmp"; say "the official release bundle is out of reach"; return 1
  fi
  tar -xzf "$tmp/pulumi.tgz" -C "$tmp"
  cp "$tmp"/pulumi/pulumi* "$bin/"
  rm -rf "$tmp"
  say "installed the official bundle v$version"
}

build_cli() {
  command -v go >/dev/null ||
    die "the official installer is unreachable and there is no Go toolchain to build the CLI with: install Go >= $(sed -n "s/^go //p" "$wrapper/go.mod") (the go.mod of tools/pulumi-cli; older Debian golang-go packages are too old) or allow access to get.pulumi.com"
  say "building the Pulumi CLI v$version with $(go version | cut -d' ' -f3) from the Go module proxy (a cold build takes minutes)"
  (cd "$wrapper" && go build -trimpath \
    -ldflags "-s -w -X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=v$version" \
    -o "$bin/pulumi" github.com/pulumi/pulumi/pkg/v3/cmd/pulumi) ||
    die "go build of the Pulumi CLI failed (is the Go module proxy reachable? GOPROXY=$(go env GOPROXY))"
  say "built $("$bin/pulumi" version)"
}

install_launchers() {
  # The release bundle's small launchers: copy them from the SDK module the CLI build just downloaded.
  local sdk
  sdk="$(cd "$wrapper" && go list -m -f '{{.Dir}}' github.com/pulumi/pulumi/sdk/v3)"
  [ -d "$sdk/python/dist" ] || die "no python/dist launchers in $sdk"
  install -m 0755 "$sdk/python/dist/pulumi-analyzer-policy-python" "$bin/" 2>/dev/null || true
  package_launchers
}

if install_release; then
  package_launchers
else
  build_cli
  install_launchers
fi
up_to_date || die "after install, $bin still lacks a working pulumi v$version or a launcher"
elapsed=$(( $(date +%s) - started ))
printf 'pulumi v%s installed in %ss on %s\n' "$version" "$elapsed" "$(date -u +%FT%TZ)" > "$tools/build-info.txt"
say "done in ${elapsed}s: $(du -sh "$tools" | cut -f1) in $tools"
