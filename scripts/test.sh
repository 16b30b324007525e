#!/usr/bin/env bash
# `make test`, after `make install test-deps`: the suite, with `make kube-tools` running beside it.
#
# With the tools cached outside the clone (scripts/cached-binary.sh), `make kube-tools` links them in seconds
# and the suite runs as it always did. On a cold machine its Go builds (kube-apiserver, the Kubernetes
# provider plugin, the test node's programs: about 35 minutes of two cores) run in the background at low
# priority while the tests that need none of them run; the ~240 that do run last and wait for the build
# (tests/kube_tools_build.py), failing, never skipping, when it failed. Its output goes to
# .tools/kube-tools.log and is printed at the end. Arguments go to pytest.
set -uo pipefail
cd "$(dirname "$0")/.."
py="${PY:-.venv/bin/python}"
mkdir -p .tools
log="$PWD/.tools/kube-tools.log"
status="$PWD/.tools/kube-tools.status"
rm -f "$status" "$status.tmp"

# setsid: the build is a process group of its own, stopped whole if the suite is interrupted.
setsid bash -c 'nice -n 10 make --no-print-directory kube-tools >"$1" 2>&1; echo $? >"$2.tmp"; mv "$2.tmp" "$2"' \
  kube-tools "$log" "$status" &
builder=$!
trap 'kill -- -"$builder" 2>/dev/null; exit 130' INT TERM
printf '[kube-tools] make kube-tools runs beside the suite (pid %s, log %s)\n' "$builder" "$log"

export PROXY_OPERATOR_KUBE_TOOLS_STATUS="$status" PROXY_OPERATOR_KUBE_TOOLS_LOG="$log"
"$py" -m pytest --durations=25 "$@"  # the slowest 25 in the log: where the budget goes
rc=$?

wait "$builder"
code="$(cat "$status" 2>/dev/null || echo 1)"
printf '[kube-tools] make kube-tools ended with exit %s; it said:\n' "$code"
sed 's/^/  /' "$log"
if [ "$code" != 0 ] && [ "$rc" = 0 ]; then
  rc=1  # every test that needed it failed already; this covers a run that selected none of them
fi
exit "$rc"
