#!/usr/bin/env bash
# `make test`, after `make install test-deps`: the suite, with `make kube-tools` running beside it.
#
# With the tools cached outside the clone (scripts/cached-binary.sh), `make kube-tools` links them in seconds
# and the suite runs as it always did. On a cold machine its Go builds (kube-apiserver, the Kubernetes
# provider plugin, the test node's programs: about 35 minutes of two cores) run in the background at low
# priority while the tests that need none of them run; the ~240 that do run last and wait for the build
# (tests/kube_tools_build.py), failing, never skipping, when it failed: those that need only the API
# server's parts (built first) before those that need the test node. Its output goes to
# .tools/kube-tools.log and is printed at the end.
#
# The whole suite (no arguments) runs as two pytest processes side by side: the tests that need the test node
# (about 50; they mostly wait on pods, rollouts and the provider's awaits) in the background, their output in
# .tools/node-tests.log, printed at the end; every other test in the foreground. Arguments go to pytest, and
# then it is one process, as is PROXY_OPERATOR_TEST_SPLIT=0.
set -uo pipefail
cd "$(dirname "$0")/.."
py="${PY:-.venv/bin/python}"
mkdir -p .tools
log="$PWD/.tools/kube-tools.log"
status="$PWD/.tools/kube-tools.status"  # the whole build's exit code, once it ended
api_status="$PWD/.tools/kube-api-tools.status"  # kube-api-tools' (etcd, kube-apiserver, the plugin)
rm -f "$status" "$status.tmp" "$api_status" "$api_status.tmp"

# The API server's parts first: the tests that need only them run while the node's programs build.
# setsid: the build is a process group of its own, stopped whole if the suite is interrupted.
build='
  set -u
  nice -n 10 make --no-print-directory kube-api-tools >"$1" 2>&1; code=$?
  echo "$code" >"$3.tmp" && mv "$3.tmp" "$3"
  if [ "$code" = 0 ]; then nice -n 10 make --no-print-directory kube-node-tools >>"$1" 2>&1; code=$?; fi
  echo "$code" >"$2.tmp" && mv "$2.tmp" "$2"'
setsid bash -c "$build" kube-tools "$log" "$status" "$api_status" &
builder=$!
trap 'kill -- -"$builder" 2>/dev/null; exit 130' INT TERM
printf '[kube-tools] make kube-tools runs beside the suite (pid %s, log %s)\n' "$builder" "$log"

export PROXY_OPERATOR_KUBE_TOOLS_STATUS="$status" PROXY_OPERATOR_KUBE_API_TOOLS_STATUS="$api_status"
export PROXY_OPERATOR_KUBE_TOOLS_LOG="$log"

node_pid=""
if [ "$#" = 0 ] && [ "${PROXY_OPERATOR_TEST_SPLIT:-1}" != 0 ]; then
  node_log="$PWD/.tools/node-tests.log"
  node_tmp="$(mktemp -d "${TMPDIR:-/tmp}/proxy-operator-node-tests.XXXXXX")"  # its own pytest folders
  # No cache plugin: two processes must not write .pytest_cache at once. SIGINT on an interrupt, not
  # SIGTERM: pytest then runs the node fixture's teardown, which puts the host back (a background job
  # starts with SIGINT ignored: the wrapper gives it Python's handler back).
  interruptible='import signal, sys, pytest; signal.signal(signal.SIGINT, signal.default_int_handler); sys.exit(pytest.main(sys.argv[1:]))'
  PROXY_OPERATOR_TEST_SHARE=node "$py" -c "$interruptible" --durations=15 -p no:cacheprovider \
    --basetemp "$node_tmp/run" </dev/null >"$node_log" 2>&1 &
  node_pid=$!
  trap 'kill -INT "$node_pid" 2>/dev/null; wait "$node_pid"; kill -- -"$builder" 2>/dev/null; exit 130' INT TERM
  printf '[node-tests] the test node'"'"'s tests run beside the suite (pid %s, log %s)\n' "$node_pid" "$node_log"
  export PROXY_OPERATOR_TEST_SHARE=rest
fi
"$py" -m pytest --durations=25 "$@"  # the slowest 25 in the log: where the budget goes
rc=$?

if [ -n "$node_pid" ]; then
  started=$SECONDS
  wait "$node_pid"; node_rc=$?
  printf '[node-tests] ended with exit %s, %s s after the rest of the suite; it said:\n' \
    "$node_rc" "$((SECONDS - started))"
  sed 's/^/  /' "$node_log"
  rm -rf "$node_tmp"
  if [ "$node_rc" != 0 ] && [ "$rc" = 0 ]; then
    rc="$node_rc"
  fi
fi

wait "$builder"
code="$(cat "$status" 2>/dev/null || echo 1)"
printf '[kube-tools] make kube-tools ended with exit %s; it said:\n' "$code"
sed 's/^/  /' "$log"
if [ "$code" != 0 ] && [ "$rc" = 0 ]; then
  rc=1  # every test that needed it failed already; this covers a run that selected none of them
fi
exit "$rc"
