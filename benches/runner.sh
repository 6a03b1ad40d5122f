#!/usr/bin/env bash
# Runner benchmark: feed cohort-runner GIB GiB (default 1) of synthetic Pi events and print its
# peak RSS and CPU seconds per GiB beside the same figures for `cat` of the same stream to
# /dev/null, measured in the same run. Targets: peak RSS ≤ 16 MiB + longest line;
# parse throughput ≥ 200 MiB/s (bytes per runner CPU second).
# Then the run-wide memory bound: a parallel group of MEMBERS (default 3) synthetic children that
# each print one kept line of LINE_MIB MiB (default 1024, past the 512 MiB cap) at once. Target:
# the runner's peak RSS ≤ 16 MiB + 512 MiB (the run's line budget) + 1 MiB per member, whatever
# the number of members (exits 1 when it is missed).
set -euo pipefail
cd "$(dirname "$0")/.."
GIB=${GIB:-1}
cargo build --quiet --release --workspace --bins
BIN="$PWD/target/release"
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
PKG="$W/pkg"; mkdir -p "$PKG/dist"
printf '{"name":"@mariozechner/pi-coding-agent","version":"0.0.0-bench","bin":{"pi":"dist/cli.js"}}' > "$PKG/package.json"
cp benches/synthetic-pi.js "$PKG/dist/cli.js"
export HOME="$W/home" PI_CODING_AGENT_DIR="$W/profile"; mkdir -p "$HOME"

longest=$(GIB=0.01 node "$PKG/dist/cli.js" | awk '{ if (length($0) > m) m = length($0) } END { print m }')
bytes=$(GIB=$GIB node "$PKG/dist/cli.js" | wc -c)

# Floor: cat of the same stream to /dev/null (GNU time measures cat alone).
GIB=$GIB node "$PKG/dist/cli.js" | /usr/bin/time -f '%M %U %S %e' -o "$W/catonly.time" cat > /dev/null

start=$(date +%s.%N)
id=$("$BIN/cohort-spawn" --pi-entry "$PKG/dist/cli.js" "bench")
"$BIN/cohort-status" --wait "$id" >/dev/null
end=$(date +%s.%N)
ev="$PI_CODING_AGENT_DIR/pi-cohort/async-subagent-runs/$id/events.jsonl"
line=$(grep '"run.completed"' "$ev")
rss=$(sed 's/.*"maxRssKiB":\([0-9]*\).*/\1/' <<<"$line")
user=$(sed 's/.*"userMs":\([0-9]*\).*/\1/' <<<"$line")
sys=$(sed 's/.*"sysMs":\([0-9]*\).*/\1/' <<<"$line")
read -r crss cuser csys _ < "$W/catonly.time"

python3 - "$bytes" "$longest" "$rss" "$user" "$sys" "$crss" "$cuser" "$csys" "$start" "$end" <<'PY'
import sys
b, longest, rss, user, sys_, crss, cuser, csys, start, end = sys.argv[1:]
b = int(b); gib = b / (1 << 30); mib = b / (1 << 20)
cpu = (int(user) + int(sys_)) / 1000; ccpu = float(cuser) + float(csys)
print(f"stream: {mib:.0f} MiB of events, longest line {int(longest)/1024:.1f} KiB")
print(f"runner: peak RSS {int(rss)/1024:.1f} MiB, CPU {cpu/gib:.2f} s/GiB, wall {float(end)-float(start):.1f} s")
print(f"cat:    peak RSS {int(crss)/1024:.1f} MiB, CPU {ccpu/gib:.2f} s/GiB")
print(f"ratio runner/cat: RSS {int(rss)/max(int(crss),1):.1f}x, CPU {cpu/max(ccpu,1e-3):.1f}x")
thr = mib / cpu if cpu else float('inf')
print(f"parse throughput: {thr:.0f} MiB per runner CPU second (target >= 200)")
print(f"RSS target: {int(rss)/1024:.1f} MiB <= 16 MiB + longest line ({16 + int(longest)/(1<<20):.1f} MiB): {'ok' if int(rss)/1024 <= 16 + int(longest)/(1<<20) else 'MISSED'}")
PY

# The run-wide bound: MEMBERS children, each one endless-looking kept line, all at once.
MEMBERS=${MEMBERS:-3}
LINE_MIB=${LINE_MIB:-1024}
tasks=(); for i in $(seq "$MEMBERS"); do tasks+=("member $i"); done
start=$(date +%s.%N)
id=$(GIB=0 LINE_MIB=$LINE_MIB "$BIN/cohort-spawn" --pi-entry "$PKG/dist/cli.js" --parallel "${tasks[@]}")
"$BIN/cohort-status" --wait "$id" >/dev/null || true
end=$(date +%s.%N)
ev="$PI_CODING_AGENT_DIR/pi-cohort/async-subagent-runs/$id/events.jsonl"
line=$(grep -E '"run\.(completed|failed)"' "$ev")
rss=$(sed 's/.*"maxRssKiB":\([0-9]*\).*/\1/' <<<"$line")
python3 - "$rss" "$MEMBERS" "$LINE_MIB" "$start" "$end" <<'PY'
import sys
rss, members, line_mib, start, end = sys.argv[1:]
rss_mib = int(rss) / 1024; members = int(members)
bound = 16 + 512 + members
print(f"parallel: {members} members, one {line_mib} MiB kept line each, {float(end)-float(start):.1f} s")
print(f"runner: peak RSS {rss_mib:.0f} MiB; target <= {bound} MiB (16 + the 512 MiB line budget + 1 MiB a member): {'ok' if rss_mib <= bound else 'MISSED'}")
sys.exit(0 if rss_mib <= bound else 1)
PY
