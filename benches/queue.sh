#!/usr/bin/env bash
# Queue benchmark: RUNS (default 200) runs of a synthetic Pi through `--queue bench --slots 4`,
# against the same runs started four at a time without a queue (spawn four, wait for the four),
# measured in the same run. Prints both wall times and the added time per run,
# (queued - baseline) / RUNS. Target: at most 5 ms per run beyond the waiting itself. The
# baseline waits for the slowest of each four, so the figure is an upper bound on the queue's
# own cost only when runs take about the same time (the synthetic child does).
# BIN=dir uses binaries already built there (default: a release build into target/release).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-200}
if [ -z "${BIN:-}" ]; then
  cargo build --quiet --release -p cohort-spawn -p cohort-runner -p cohort-status
  BIN="${CARGO_TARGET_DIR:-$PWD/target}/release"
fi
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
PKG="$W/pkg"; mkdir -p "$PKG/dist"
printf '{"name":"@mariozechner/pi-coding-agent","version":"0.0.0-bench","bin":{"pi":"dist/cli.js"}}' > "$PKG/package.json"
cp benches/synthetic-pi.js "$PKG/dist/cli.js"
export HOME="$W/home" PI_CODING_AGENT_DIR="$W/profile" GIB=0.0001; mkdir -p "$HOME"
spawn() { "$BIN/cohort-spawn" --pi-entry "$PKG/dist/cli.js" "$@" bench < /dev/null; }

t0=$(date +%s.%N)
for ((i = 0; i < RUNS; i += 4)); do
  ids=()
  for ((j = 0; j < 4 && i + j < RUNS; j++)); do ids+=("$(spawn)"); done
  for id in "${ids[@]}"; do "$BIN/cohort-status" --wait "$id" > /dev/null; done
done
t1=$(date +%s.%N)
ids=()
for ((i = 0; i < RUNS; i++)); do ids+=("$(spawn --queue bench --slots 4)"); done
for id in "${ids[@]}"; do "$BIN/cohort-status" --wait "$id" > /dev/null; done
t2=$(date +%s.%N)
python3 - "$RUNS" "$t0" "$t1" "$t2" <<'PY'
import sys
n, t0, t1, t2 = int(sys.argv[1]), *map(float, sys.argv[2:])
base, queued = t1 - t0, t2 - t1
print(f"runs {n}  baseline (batches of 4) {base:.2f} s  queue of 4 {queued:.2f} s  "
      f"ratio {queued / base:.3f}  added per run {(queued - base) / n * 1000:.1f} ms (target <= 5 ms)")
PY
