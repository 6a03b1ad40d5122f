#!/usr/bin/env bash
# Queue benchmark: RUNS (default 200) runs of a synthetic Pi through `--queue bench --slots 4`,
# against the same runs without a queue, measured in the same run on the same machine. Both
# keep four runs alive at once and each starts the moment a place is free: the queued runs are
# all spawned at once and the queue lets four at a time in; the baseline's are started by
# `xargs -P 4`, each `cohort-spawn --wait` started as the one before it in its lane returns.
# Each run is the same `cohort-spawn ... bench` invocation, with `--queue bench --slots 4` or
# `--wait` added. Wall time is four lanes of RUNS/4 runs each, so the queue's added latency per
# run is (queued - baseline) * 4 / RUNS, which also counts the baseline's spawn per run and,
# for the queued runs, the serial spawn loop whenever a spawn is slower than a quarter of a run
# (the queued runs' spawns overlap the runs). The latency itself comes from the records: a run's
# start-up is from the moment it may start (without a queue: its spawn made it; through the
# queue: the end of the run whose exit let it in, or its spawn if later) to its step's start,
# and what the queue adds beyond the waiting itself is the difference of the medians. Target:
# at most 5 ms. BIN=dir uses binaries already built there (default: a release build into
# target/release). A run takes about a tenth of a second, so 200 of each take a minute or two.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-200}
SLOTS=4
if [ -z "${BIN:-}" ]; then
  cargo build --quiet --release -p cohort-spawn -p cohort-runner -p cohort-status
  BIN="${CARGO_TARGET_DIR:-$PWD/target}/release"
fi
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
PKG="$W/pkg"; mkdir -p "$PKG/dist"
printf '{"name":"@mariozechner/pi-coding-agent","version":"0.0.0-bench","bin":{"pi":"dist/cli.js"}}' > "$PKG/package.json"
cp benches/synthetic-pi.js "$PKG/dist/cli.js"
export HOME="$W/home" GIB=0.0001; mkdir -p "$HOME"
export BIN PKG

# One profile per variant, so each one's records are its own.
profile() { export PI_CODING_AGENT_DIR="$W/$1"; mkdir -p "$PI_CODING_AGENT_DIR"; }
spawn() { "$BIN/cohort-spawn" --pi-entry "$PKG/dist/cli.js" "$@" bench < /dev/null; }

profile baseline
t0=$(date +%s.%N)
seq "$RUNS" | xargs -P "$SLOTS" -I{} sh -c \
  '"$BIN/cohort-spawn" --pi-entry "$PKG/dist/cli.js" --wait --quiet bench < /dev/null > /dev/null'
t1=$(date +%s.%N)
"$BIN/cohort-status" --limit 0 --json > "$W/baseline.jsonl"

profile queued
ids=()
for ((i = 0; i < RUNS; i++)); do ids+=("$(spawn --queue bench --slots "$SLOTS")"); done
for id in "${ids[@]}"; do "$BIN/cohort-status" --wait "$id" > /dev/null; done
t2=$(date +%s.%N)
"$BIN/cohort-status" --limit 0 --json > "$W/queued.jsonl"

python3 - "$RUNS" "$SLOTS" "$t0" "$t1" "$t2" "$W/baseline.jsonl" "$W/queued.jsonl" "$W/queued/pi-cohort/async-subagent-runs" "${ids[@]}" <<'PY'
import json, os, sys
n, slots = int(sys.argv[1]), int(sys.argv[2])
t0, t1, t2 = map(float, sys.argv[3:6])
base_recs = list(map(json.loads, open(sys.argv[6])))
recs = {r["runId"]: r for r in map(json.loads, open(sys.argv[7]))}
runs_dir = sys.argv[8]
order = [recs[i] for i in sys.argv[9:]]          # the spawn order, which is the queue's
def admitted_at(r):
    with open(os.path.join(runs_dir, r["runId"], "events.jsonl")) as f:
        return next(e["ts"] for e in map(json.loads, f) if e["type"] == "run.admitted")
bad = [r["runId"] for r in order if r.get("state") != "complete"]
if bad:
    sys.exit(f"{len(bad)} queued runs did not complete, e.g. {bad[0]}")
# Run k is let in once fewer than `slots` of the runs before it are alive: at the
# (k - slots + 1)-th end among them. Its hand-over is from then to its step's start.
handover, wake, after = [], [], []
for k in range(slots, len(order)):
    ends = sorted(r["endedAt"] for r in order[:k])
    free = max(ends[k - slots], order[k]["startedAt"])
    step = order[k]["steps"][0]["startedAt"]
    handover.append(step - free)
    wake.append(admitted_at(order[k]) - free)
    after.append(step - admitted_at(order[k]))
def med(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else 0
def p95(xs):
    xs = sorted(xs)
    return xs[int(len(xs) * 0.95)] if xs else 0
# Without a queue a run may start when spawn makes it: its start-up is from then to its step.
startup = [r["steps"][0]["startedAt"] - r["startedAt"] for r in base_recs if r.get("state") == "complete"]
base, queued = t1 - t0, t2 - t1
wall_added = (queued - base) * slots / n * 1000
print(f"runs {n} slots {slots}  wall: baseline (xargs -P {slots}, no queue) {base:.2f} s, "
      f"queue of {slots} {queued:.2f} s, ratio {queued / base:.3f}, "
      f"{wall_added:+.1f} ms per run (the queued runs are spawned one after another, so when a "
      f"spawn takes longer than a quarter of a run the spawn loop, not the queue, sets this)")
print(f"start-up, from when a run may start to its step's start: without a queue median "
      f"{med(startup)} ms p95 {p95(startup)} ms; through the queue median {med(handover)} ms "
      f"p95 {p95(handover)} ms")
print(f"  of which from the end of the run that let it in to its admission (that run's "
      f"final record synced and its place let go, the wake, the count) median {med(wake)} ms p95 {p95(wake)} ms, then to its "
      f"step median {med(after)} ms")
print(f"added latency per run beyond the waiting itself (median): "
      f"{med(handover) - med(startup)} ms (target <= 5 ms)")
PY
