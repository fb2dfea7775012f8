#!/usr/bin/env bash
# Builds and downloads what the stack runs (Kubernetes, etcd, helm and the node's tools
# in one Go build, Kafka, the pause program), each step cached and a no-op when done. Holds $STACK_BUILD_LOCK while it runs,
# so two builds never write one cache.
#
#   build-stack.sh               in the foreground (what up.sh runs; waits for a
#                                background build first)
#   build-stack.sh --background  detached, logging to $STACK_BUILD_LOG; returns at once.
#                                `make up` starts it before `cargo build`: on two cores
#                                the Go linker, the module and Maven downloads and
#                                cargo's serial stretches leave a core idle that the
#                                other build fills. If it fails, the foreground run
#                                repeats the failed step and shows its error.
source "$(dirname "$0")/lib.sh"
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OXBOW_CACHE"

# Explicit returns: `if steps` below would switch errexit off inside it.
steps() {
  # Maven's downloads beside the Go builds: one is network, the others CPU.
  bash "$here/fetch-kafka.sh" &
  local kafka=$!
  bash "$here/build-go.sh" || return 1
  bash "$here/build-node.sh" || return 1
  wait "$kafka" || return 1
}

if [[ "${1:-}" == "--background" ]]; then
  # The lock is taken inside the detached session, so it is held exactly as long as the
  # build runs; a build already running (another `make`) is left to finish.
  log "building the stack's Go programs and fetching Kafka in the background (log: $STACK_BUILD_LOG)"
  setsid bash -c '
    exec 9>"$1"
    flock -n 9 || exit 0
    shift
    "$@"
  ' _ "$STACK_BUILD_LOCK" bash "$here/build-stack.sh" --steps >"$STACK_BUILD_LOG" 2>&1 </dev/null &
  exit 0
fi

if [[ "${1:-}" == "--steps" ]]; then
  t0=$SECONDS
  if steps; then
    log "stack builds done in $((SECONDS - t0))s"
  else
    log "a stack build failed after $((SECONDS - t0))s; \`make up\` repeats it in the foreground"
    exit 1
  fi
  exit 0
fi

# Foreground: wait for a background build (the lock), then run every step; the ones it
# finished are no-ops. The lock is released before up.sh starts any daemon, which would
# otherwise inherit it.
exec 9>"$STACK_BUILD_LOCK"
if ! flock -n 9; then
  log "waiting for the stack's background build (log: $STACK_BUILD_LOG)"
  flock 9
fi
steps
