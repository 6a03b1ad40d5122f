#!/usr/bin/env bash
# The main job end to end, on the bundled fake model server: build cohort, install a pinned Pi
# CLI (once, into .pi-cli/), start a background run in a temp Pi profile, watch it go
# queued → running → complete, print the model's reply, and reap the finished run.
# Pi: the current generation (@earendil-works/pi-coding-agent 1.6.0) when the system's Node
# meets its engines.node (22.19+, checked before anything is downloaded), else
# @mariozechner/pi-coding-agent 0.73.1 (Node 20.6+).
# DEMO_PI=1.6 forces the current one (a Node 22 is then installed from npm into .pi-cli/ when
# needed); DEMO_PI=0.73 the older one.
# Touches nothing outside the repo and a temp dir; the fake server listens on 127.0.0.1 only.
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in cargo node npm; do
  command -v "$tool" >/dev/null || { echo "demo: $tool is required (Node.js 20+ and npm for Pi)" >&2; exit 2; }
done

echo "== building cohort (the first build fetches and compiles every dependency: a few minutes on 2 cores)"
cargo build --workspace --bins
BIN="$PWD/target/debug"
# pi-install prints "KEY<TAB>NODE<TAB>ENTRY" (tests/src/pi.rs installs the same way for the suite).
case "${DEMO_PI:-}" in
  "") if ! PICKED=$("$BIN/pi-install" --system-node 1.6); then
        echo "== the system's Node does not meet Pi 1.6.0's engines.node: using Pi 0.73.1 (DEMO_PI=1.6 installs a Node 22 from npm)"
        PICKED=$("$BIN/pi-install" 0.73)
      fi ;;
  *) PICKED=$("$BIN/pi-install" "$DEMO_PI") ;;
esac
IFS=$'\t' read -r PI_GEN NODE ENTRY <<< "$PICKED"
echo "== Pi $PI_GEN: $ENTRY on $NODE ($("$NODE" --version))"

WORK=$(mktemp -d)
SERVER_PID=""
trap '[ -z "$SERVER_PID" ] || kill "$SERVER_PID" 2>/dev/null || true; rm -rf "$WORK"' EXIT
export HOME="$WORK/home" PI_CODING_AGENT_DIR="$WORK/profile"
mkdir -p "$HOME" "$PI_CODING_AGENT_DIR" "$WORK/bin"
ln -s "$ENTRY" "$WORK/bin/pi"          # `pi` and its `node` on PATH, as a user would have them
ln -s "$NODE" "$WORK/bin/node"
export PATH="$BIN:$WORK/bin:$PATH"

# --detach returns once the server listens and the profile is written, printing its pid.
SERVER_PID=$("$BIN/fake-model-server" --detach --log "$WORK/requests.jsonl" --profile "$PI_CODING_AGENT_DIR")
echo "== fake model server (pid $SERVER_PID) on 127.0.0.1, its Pi profile in $PI_CODING_AGENT_DIR"

HERMETIC=(--no-extensions --no-skills --no-prompt-templates --no-themes --no-context-files)
echo "== cohort-spawn --model fake/tool 'RUN: uname -s'"
ID=$(cohort-spawn --model fake/tool "RUN: uname -s" -- "${HERMETIC[@]}")
echo "run id: $ID"
last=""
while :; do
  state=$(sed -n 's/^  "state": "\([a-z]*\)".*/\1/p' "$PI_CODING_AGENT_DIR/pi-cohort/async-subagent-runs/$ID/status.json")
  [ "$state" != "$last" ] && echo "state: $state" && last=$state
  case $state in complete|failed|stopped|paused) break ;; esac
  sleep 0.1
done
echo "== the run's lifecycle, from its events.jsonl (spawn publishes queued before the runner starts)"
awk -F'"ts":' 'NR == 1 { split($2, a, ","); t0 = a[1] }
  { split($2, a, ","); t = a[1]; match($0, /"type":"[a-zA-Z.]*"/); ty = substr($0, RSTART + 8, RLENGTH - 9)
    st = ty; if (ty == "run.queued") st = "queued"; else if (ty == "run.started") st = "running";
    else if (ty == "run.completed") st = "complete"; else if (ty == "run.failed") st = "failed";
    printf "  +%5d ms  %-15s%s\n", t - t0, ty, (st != ty ? "-> state " st : "") }' \
  "$PI_CODING_AGENT_DIR/pi-cohort/async-subagent-runs/$ID/events.jsonl"
echo "== cohort-status"
cohort-status
echo "== cohort-status --wait $ID"
cohort-status --wait "$ID" && echo "completed"
echo "== cohort-status --output $ID"
cohort-status --output "$ID"
echo "== cohort-status $ID"
cohort-status "$ID"
echo "== cohort-reap $ID"
cohort-reap "$ID"
[ "$state" = complete ]
