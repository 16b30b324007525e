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

# The checkout's launcher of the package's language host (not over the official bundle's Go host). Rewritten
# when it differs, so a .tools/ made before the host moved into the package is mended without a rebuild.
langhost_launcher() {
  local target="$bin/pulumi-language-python" want
  [ -e "$target" ] && [ "$(head -c2 "$target")" != "#!" ] && return 0
  want="#!/bin/sh
# Python language host for Pulumi v$version, shipped in the package: see automation/engine/langhost.py.
exec \"\${PULUMI_PYTHON_CMD:-$root/.venv/bin/python}\" -m automation.engine.langhost \"\$@\""
  [ "$(cat "$target" 2>/dev/null)" = "$want" ] && return 0
  mkdir -p "$bin"
  printf '%s\n' "$want" > "$target"
  chmod 0755 "$target"
  say "installed pulumi-language-python (launcher of automation.engine.langhost)"
}

[ -x "$bin/pulumi" ] && langhost_launcher
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
  [ -f "$sdk/python/dist/pulumi-resource-pulumi-python" ] || die "no python/dist launchers in $sdk"
  install -m 0755 "$sdk/python/dist/pulumi-resource-pulumi-python" "$bin/"
  install -m 0755 "$sdk/python/dist/pulumi-analyzer-policy-python" "$bin/" 2>/dev/null || true
  say "installed pulumi-resource-pulumi-python"
  langhost_launcher
}

if ! install_release; then
  build_cli
  install_launchers
fi
up_to_date || die "after install, $bin still lacks a working pulumi v$version or a launcher"
elapsed=$(( $(date +%s) - started ))
printf 'pulumi v%s installed in %ss on %s\n' "$version" "$elapsed" "$(date -u +%FT%TZ)" > "$tools/build-info.txt"
say "done in ${elapsed}s: $(du -sh "$tools" | cut -f1) in $tools"
