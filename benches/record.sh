#!/usr/bin/env bash
# Record-write benchmark: a chain of STEPS steps (default 1,000), every step's task the chain's
# TASK of TASK_KIB KiB (default 1,024: 1 MiB, given on stdin), run by a synthetic Pi that answers
# at once. Prints the bytes the runner wrote to status.json (its own count, the terminal event's
# `recordWrites`), per step and per second, and the largest record, and exits 1 when a bound is
# missed:
#   - the record's size per step stays under 4 KiB (a step keeps a task preview of at most
#     1 KiB, `record::TASK_PREVIEW_BYTES`), whatever the task's size;
#   - progress writes put at most 256 KiB a second on the disk (`writer::RECORD_BYTES_PER_SEC`)
#     plus one record, whatever the chain's length; so a step of d seconds costs at most
#     256 KiB times d (plus one record).
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-1000}
TASK_KIB=${TASK_KIB:-1024}
cargo build --quiet --release --workspace --bins
BIN="$PWD/target/release"
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
PKG="$W/pkg"; mkdir -p "$PKG/dist"
printf '{"name":"@mariozechner/pi-coding-agent","version":"0.0.0-bench","bin":{"pi":"dist/cli.js"}}' > "$PKG/package.json"
cp benches/synthetic-pi.js "$PKG/dist/cli.js"
export HOME="$W/home" PI_CODING_AGENT_DIR="$W/profile" GIB=0; mkdir -p "$HOME"

python3 - "$STEPS" > "$W/chain.json" <<'PY'
import json, sys
print(json.dumps({"chain": [{"task": "{task}"} for _ in range(int(sys.argv[1]))]}))
PY
head -c $((TASK_KIB * 1024)) /dev/zero | tr '\0' 'x' > "$W/task.txt"

start=$(date +%s.%N)
id=$("$BIN/cohort-spawn" --pi-entry "$PKG/dist/cli.js" --chain-file "$W/chain.json" - < "$W/task.txt")
"$BIN/cohort-status" --wait "$id" >/dev/null || true
end=$(date +%s.%N)
run="$PI_CODING_AGENT_DIR/pi-cohort/async-subagent-runs/$id"
line=$(grep -E '"run\.(completed|failed|stopped)"' "$run/events.jsonl")
size=$(stat -c %s "$run/status.json")
state=$("$BIN/cohort-status" --json "$id" | python3 -c 'import json,sys; print(json.load(sys.stdin)["state"])')

python3 - "$line" "$size" "$STEPS" "$TASK_KIB" "$start" "$end" "$state" <<'PY'
import json, sys
line, size, steps, kib, start, end, state = sys.argv[1:]
ev = json.loads(line)
w = (ev.get("data") or ev).get("recordWrites")
size, steps = int(size), int(steps)
secs = float(end) - float(start)
per_step = w["bytes"] / steps
per_sec = w["bytes"] / secs
print(f"run: {steps} steps, task {kib} KiB, {state}, {secs:.1f} s")
print(f"status.json: {w['count']} writes, {w['bytes'] / (1 << 20):.1f} MiB in all (final write not counted)")
print(f"per step: {per_step / 1024:.1f} KiB; per second: {per_sec / 1024:.0f} KiB; final record {size / 1024:.0f} KiB ({size / steps:.0f} B a step)")
ok = True
if state != "complete":
    print("MISSED: the run did not complete"); ok = False
if size / steps > 4096:
    print(f"MISSED: the record holds {size / steps:.0f} B a step (bound 4096)"); ok = False
bound = 256 * 1024 * secs + size
if w["bytes"] > bound:
    print(f"MISSED: {w['bytes']} B written > {bound:.0f} (256 KiB/s and one record)"); ok = False
print("bounds: ok" if ok else "bounds: MISSED")
sys.exit(0 if ok else 1)
PY
