#!/usr/bin/env bash
# Peers benchmark: cohort-spawn beside nq (and pueue, when pueue and pueued are on PATH), in one
# run and in turns, on a release build. Every command runs through `sh -c`, as in a shell loop.
# For each history size (SIZES, default "0 10000 100000" earlier runs) it prints, as medians of
# REPS turns (default 21), with the ratio cohort/peer:
#   - the time to print the id;
#   - the time until the child process starts (the child, benches/recorded-pi.js, notes its
#     process start time);
#   - the default listing (cohort-status; `ls` of NQDIR, which is nq's listing; `pueue status`),
#     settled (nothing changed for 2 s) and right after a spawn;
# and, once: BURST (default 20) spawns back to back in one shell loop beside a loop of BURST
# `nq node …` of the same child (the target's baseline), a loop of `setsid
# node … &` of the same child and one of `setsid -f node …` (which returns once it has forked,
# the least any starter that prints after starting its child waits for); spawn + wait of a run whose Pi exits at once beside running that Pi directly (the
# recorded fake, then the real pinned Pi 0.73.1 answered by the bundled fake model server on
# 127.0.0.1, installed into .pi-cli/ by pi-install; PI_ROW=0 skips it), the CPU an idle runner
# uses beside 3,000 unrelated sleeping processes (baseline: the same runner with nothing else on
# the host), and spawn --wait of the recorded fake beside those processes (baseline: the same
# spawn --wait with nothing else on the host, in alternating blocks, and that Pi run directly). It prints the
# containment runs get here first (`cohort-status --doctor`: a cgroup per run or /proc
# tracking). SIZES="" and PI_ROW=0 leave only the rows beside the sleeping processes. Targets in
# the README ("Benchmarks").
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v nq >/dev/null; then
  if [ "$(id -u)" = 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nq >/dev/null \
      || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nq >/dev/null; }
  else
    sudo apt-get install -y -qq nq >/dev/null
  fi
fi
cargo build --quiet --release -p cohort-spawn -p cohort-runner -p cohort-status -p cohort-reap
# pi-install and fake-model-server, for the row with the real, pinned Pi.
cargo build --quiet --release -p cohort-e2e --bins
W=$(mktemp -d)
# Reaped before the profile goes: a run's empty cgroup is removed by the reader that comes
# after it, and once the profile is deleted no reader ever comes.
BIN_="${CARGO_TARGET_DIR:-$PWD/target}/release"
trap 'PI_CODING_AGENT_DIR="$W/profile" "$BIN_/cohort-reap" --all-terminal >/dev/null 2>&1; rm -rf "$W"' EXIT
BIN="${CARGO_TARGET_DIR:-$PWD/target}/release" W="$W" SIZES="${SIZES-0 10000 100000}" REPS="${REPS:-21}" \
  IDLE_PROCS="${IDLE_PROCS:-3000}" IDLE_S="${IDLE_S:-10}" exec python3 - <<'PY'
import json, os, random, shutil, statistics, subprocess, sys, time

BIN, W = os.environ["BIN"], os.environ["W"]
SIZES = [int(s) for s in os.environ["SIZES"].split()]
REPS = int(os.environ["REPS"])
PKG = os.path.join(W, "pkg")
os.makedirs(os.path.join(PKG, "dist"))
with open(os.path.join(PKG, "package.json"), "w") as f:
    json.dump({"name": "@mariozechner/pi-coding-agent", "version": "0.0.0-bench",
               "bin": {"pi": "dist/cli.js"}}, f)
ENTRY = os.path.join(PKG, "dist", "cli.js")
shutil.copy("benches/recorded-pi.js", ENTRY)
NODE = shutil.which("node")
PROFILE, NQDIR = os.path.join(W, "profile"), os.path.join(W, "nq")
os.makedirs(NQDIR)
ENV = dict(os.environ, PI_CODING_AGENT_DIR=PROFILE, HOME=os.path.join(W, "home"), NQDIR=NQDIR)
for k in [k for k in ENV if k.startswith("COHORT_")]:
    del ENV[k]
os.makedirs(ENV["HOME"])
RUNS = os.path.join(PROFILE, "pi-cohort", "async-subagent-runs")
PUEUE = shutil.which("pueue") and shutil.which("pueued")

def sh(cmd, env=None, capture=False):
    """Run `sh -c cmd`; returns (seconds, stdout)."""
    t0 = time.perf_counter()
    p = subprocess.run(["sh", "-c", cmd], env=env or ENV, check=True,
                       stdout=subprocess.PIPE if capture else subprocess.DEVNULL)
    return time.perf_counter() - t0, (p.stdout.decode().strip() if capture else "")

def wait_file(path, timeout=60):
    end = time.time() + timeout
    while not (os.path.exists(path) and os.path.getsize(path) > 0):
        if time.time() > end:
            raise SystemExit(f"the child never started: {path} missing")
        time.sleep(0.002)
    return float(open(path).read()) / 1000

def timed_start(mark, start_cmd, wait_cmd):
    """Start the child with `start_cmd` (timed: until it printed its id), note when the child
    started, then wait for it with `wait_cmd(id)` (untimed); returns (seconds, seconds)."""
    env = dict(ENV, BENCH_MARK=mark)
    t_wall = time.time()
    dt, out = sh(start_cmd, env, capture=True)
    child = wait_file(mark) - t_wall
    sh(wait_cmd(out))
    return dt, child

STARTS = {
    "cohort": (f'"{BIN}/cohort-spawn" --pi-entry "{ENTRY}" bench',
               lambda rid: f'"{BIN}/cohort-status" --wait {rid}'),
    "nq": (f'nq "{NODE}" "{ENTRY}" bench', lambda job: f'nq -w {job}'),
    "pueue": (f'pueue add -p -- "{NODE}" "{ENTRY}" bench',
              lambda out: f'pueue wait {out.split()[-1]}'),
}

def uuid7(ms):
    r = random.getrandbits(74)
    v = (ms << 80) | (0x7 << 76) | ((r >> 62) << 64) | (0b10 << 62) | (r & ((1 << 62) - 1))
    h = f"{v:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"

def grow_history(have, want):
    """Add terminal cohort runs and finished nq jobs until each has `want` earlier runs."""
    now = int(time.time() * 1000) - 86_400_000
    os.makedirs(RUNS, exist_ok=True)
    for i in range(have, want):
        ms = now - 90 * 86_400_000 + i * 60
        rid = uuid7(ms)
        d = os.path.join(RUNS, rid)
        os.mkdir(d, 0o700)
        rec = {"formatVersion": 1, "runId": rid, "state": "complete", "mode": "single",
               "cwd": "/home/ada/src", "runtime": None, "startedAt": ms, "lastUpdate": ms + 9000,
               "endedAt": ms + 9000, "error": None, "currentStep": 0, "chainStepCount": 1,
               "parallelGroups": [], "depth": 0,
               "steps": [{"agent": "step-0", "task": f"history run {i}", "status": "complete",
                          "startedAt": ms + 100, "endedAt": ms + 9000, "exitCode": 0}]}
        with open(os.path.join(d, "status.json"), "w") as f:
            json.dump(rec, f)
        open(os.path.join(d, "runner.lock"), "w").close()
        open(os.path.join(NQDIR, f",{ms:x}.{10000 + i % 50000}"), "w").close()
    old = time.time() - 60
    os.utime(RUNS, (old, old))

def med(xs):
    return statistics.median(xs) * 1000

def row(name, cohort, peers, unit="ms"):
    cells = [f"{name:<44} cohort {med(cohort):8.2f} {unit}"]
    for pname, xs in peers:
        cells.append(f"{pname} {med(xs):8.2f} {unit}  ratio {med(cohort) / med(xs):5.2f}")
    print("   ".join(cells), flush=True)

load = lambda: open("/proc/loadavg").read().split()[:3]
print(f"peers bench: {REPS} turns per row, medians; load average at start {' '.join(load())}; "
      f"{os.cpu_count()} cores; pueue {'on PATH' if PUEUE else 'not on PATH (skipped)'}", flush=True)
if PUEUE:
    PDIR = os.path.join(W, "pueue")
    os.makedirs(PDIR)
    cfg = os.path.join(PDIR, "pueue.yml")
    with open(cfg, "w") as f:
        f.write(f"shared:\n  pueue_directory: {PDIR}\n  runtime_directory: {PDIR}\n"
                f"  use_unix_socket: true\n  unix_socket_path: {PDIR}/pueue.sock\n"
                f"daemon:\n  default_parallel_tasks: 1\n")
    ENV["PUEUE_CONFIG_PATH"] = cfg
    pueued = subprocess.Popen(["pueued", "-c", cfg], env=ENV, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    end = time.time() + 10
    while not os.path.exists(f"{PDIR}/pueue.sock") and time.time() < end:
        time.sleep(0.01)

have = 0
marks = os.path.join(W, "marks")
os.makedirs(marks)
for size in SIZES:
    if size > have:
        t0 = time.time()
        grow_history(have, size)
        have = size
        print(f"-- {size} earlier runs (generated in {time.time() - t0:.0f} s)", flush=True)
    else:
        print(f"-- {size} earlier runs", flush=True)
    sh(f'"{BIN}/cohort-status"')  # the index is built once, as any first listing would
    res = {"cohort": ([], []), "nq": ([], []), "pueue": ([], [])}
    # pueue's history is not generated: it is measured with its own, empty one at size 0 only.
    starters = ["cohort", "nq"] + (["pueue"] if PUEUE and size == 0 else [])
    for r in range(REPS):
        for name in starters:
            dt, child = timed_start(os.path.join(marks, f"{size}-{name}-{r}"), *STARTS[name])
            res[name][0].append(dt)
            res[name][1].append(child)
    peers = [(n, res[n][0]) for n in starters[1:]]
    row(f"time to print the id ({size} runs)", res["cohort"][0], peers)
    peers = [(n, res[n][1]) for n in starters[1:]]
    row(f"time until the child starts ({size} runs)", res["cohort"][1], peers)
    # Listings, settled: nothing has changed for 2 s.
    time.sleep(2.1)
    lc, ln, lp = [], [], []
    for r in range(REPS):
        lc.append(sh(f'"{BIN}/cohort-status"')[0])
        ln.append(sh(f'ls "{NQDIR}"')[0])
        if "pueue" in starters:
            lp.append(sh("pueue status")[0])
    row(f"default listing, settled ({size} runs)", lc,
        [("nq(ls)", ln)] + ([("pueue status", lp)] if lp else []))
    settled = lc
    # Right after a spawn (the run has ended; its directory changed within 2 s).
    la = []
    for r in range(max(5, REPS // 3)):
        _, rid = sh(f'"{BIN}/cohort-spawn" --pi-entry "{ENTRY}" bench', capture=True)
        sh(f'"{BIN}/cohort-status" --wait {rid}')
        la.append(sh(f'"{BIN}/cohort-status"')[0])
    print(f"{'default listing right after a spawn':<44} cohort {med(la):8.2f} ms   settled "
          f"{med(settled):8.2f} ms   difference {med(la) - med(settled):8.2f} ms (target <= 15 at 100,000)",
          flush=True)

# A burst: BURST (default 20) starts back to back in one shell loop, as a parallel audit is
# started, beside `setsid node … &` and `setsid -f node …` of the same child in the same loop.
# Timed: the loop; then (untimed) every child is waited for before the next turn.
BURST = int(os.environ.get("BURST", "20"))

def burst_cohort(turn):
    t0 = time.perf_counter()
    out = subprocess.run(["sh", "-c", f'for i in $(seq {BURST}); do "{BIN}/cohort-spawn" '
                          f'--pi-entry "{ENTRY}" burst; done'], env=ENV, check=True,
                         stdout=subprocess.PIPE).stdout.decode().split()
    dt = time.perf_counter() - t0
    sh(f'"{BIN}/cohort-status" --wait {" ".join(out)}')
    return dt

def burst_setsid(turn, how):
    """The loop of `setsid node …` started in the background (`&`, how="&": the shell waits for
    nothing) or with `setsid -f` in the foreground (how="-f": each turn waits for setsid, which
    returns once it has forked the child, as any starter that prints something after starting
    the child must)."""
    tag = f"burst-{os.getpid()}-{turn}-{'bg' if how == '&' else 'fg'}"
    flag, end_ = ("", "&") if how == "&" else ("-f ", ";")
    dt, _ = sh(f'for i in $(seq {BURST}); do setsid {flag}"{NODE}" "{ENTRY}" {tag} '
               f'</dev/null >/dev/null 2>&1 {end_} done')
    end = time.time() + 60
    while subprocess.run(["pgrep", "-f", tag], stdout=subprocess.DEVNULL).returncode == 0:
        if time.time() > end:
            raise SystemExit(f"the {tag} children did not end")
        time.sleep(0.01)
    return dt

def burst_nq(turn):
    """The loop of `nq node …` of the same child (each prints its job id once it has forked
    the job, as cohort-spawn does); then (untimed) every job is waited for with `nq -w`."""
    t0 = time.perf_counter()
    out = subprocess.run(["sh", "-c", f'for i in $(seq {BURST}); do nq "{NODE}" "{ENTRY}" '
                          f'burst; done'], env=ENV, check=True,
                         stdout=subprocess.PIPE).stdout.decode().split()
    dt = time.perf_counter() - t0
    sh(f'nq -w {" ".join(out)}')
    return dt

bc, bn, bs, bf = [], [], [], []
for r in range(max(5, REPS // 3)):
    bc.append(burst_cohort(r))
    bn.append(burst_nq(r))
    bs.append(burst_setsid(r, "&"))
    bf.append(burst_setsid(r, "-f"))
row(f"{BURST} starts back to back (target <= 1.5x nq)", bc,
    [("nq", bn), ("setsid &", bs), ("setsid -f", bf)])

# Spawn + wait of a run whose Pi exits at once, beside running that Pi directly.
direct, wrapped, nqw = [], [], []
for r in range(REPS):
    direct.append(sh(f'"{NODE}" "{ENTRY}" bench')[0])
    wrapped.append(sh(f'id=$("{BIN}/cohort-spawn" --pi-entry "{ENTRY}" bench) && '
                      f'"{BIN}/cohort-status" --wait "$id"')[0])
    nqw.append(sh(f'nq -w "$(nq -q "{NODE}" "{ENTRY}" bench; ls -t "{NQDIR}" | head -1)"')[0])
row("spawn + --wait, Pi exits at once", wrapped, [("Pi directly", direct), ("nq+nq -w", nqw)])

# The same with the real Pi: its start (module loading, about a second) is what a run costs.
picked = subprocess.run([f"{BIN}/pi-install", "0.73"], capture_output=True, text=True)
if os.environ.get("PI_ROW", "1") == "0" or picked.returncode != 0:
    print(f"{'spawn --wait, the real Pi':<44} skipped {picked.stderr.strip()}", flush=True)
else:
    _, pnode, pentry = picked.stdout.strip().split("\t")
    pprof = os.path.join(W, "pi-profile")
    server = subprocess.Popen([f"{BIN}/fake-model-server", "--log", os.path.join(W, "requests.jsonl"),
                               "--profile", pprof], stdout=subprocess.PIPE)
    server.stdout.readline()  # the port: listening, and the profile is written
    penv = dict(ENV, PI_CODING_AGENT_DIR=pprof)
    flags = "--no-extensions --no-skills --no-prompt-templates --no-themes --no-context-files"
    pi_direct = f'"{pnode}" "{pentry}" --mode json -p --model fake/plain {flags} hi'
    pi_spawned = (f'"{BIN}/cohort-spawn" --wait --node "{pnode}" --pi-entry "{pentry}" '
                  f'--model fake/plain hi -- {flags} 2>/dev/null')
    sh(pi_direct, penv), sh(pi_spawned, penv)  # Node's compile cache, warm for both
    pd, pw = [], []
    for r in range(REPS):
        pd.append(sh(pi_direct, penv)[0])
        pw.append(sh(pi_spawned, penv)[0])
    row("spawn --wait, the real Pi 0.73.1 at once", pw, [("Pi directly", pd)])
    server.kill()

# An idle runner's CPU, with nothing else and beside IDLE_PROCS unrelated sleeping processes.
def runner_cpu(seconds):
    env = dict(ENV, BENCH_IDLE_S=str(seconds + 30))
    _, rid = sh(f'"{BIN}/cohort-spawn" --pi-entry "{ENTRY}" idle', env, capture=True)
    _, pid = sh(f'"{BIN}/cohort-status" --pid {rid}', capture=True)
    time.sleep(3)  # past the first looks at the new child's tree
    cpu = lambda: int(open(f"/proc/{pid}/schedstat").read().split()[0])
    c0, t0 = cpu(), time.monotonic()
    time.sleep(seconds)
    c1, t1 = cpu(), time.monotonic()
    subprocess.run(["kill", pid])
    sh(f'"{BIN}/cohort-status" --wait {rid} 2>/dev/null || true')
    return (c1 - c0) / 1e9 / (t1 - t0) * 100

def spawn_waits(reps):
    direct, wrapped = [], []
    for r in range(reps):
        direct.append(sh(f'"{NODE}" "{ENTRY}" bench')[0])
        wrapped.append(sh(f'"{BIN}/cohort-spawn" --wait --pi-entry "{ENTRY}" bench 2>/dev/null')[0])
    return direct, wrapped

# The containment the runs get here (a cgroup per run, or /proc tracking and why).
doctor = json.loads(sh(f'"{BIN}/cohort-status" --doctor --json || true', capture=True)[1] or "{}")
print(f"{'containment':<44} {json.dumps(doctor.get('containment'))}", flush=True)
idle_s = float(os.environ["IDLE_S"])
alone = runner_cpu(idle_s)
n = int(os.environ["IDLE_PROCS"])
# A step's end looks for what the step left: with /proc tracking among the host's processes
# (its cost grows with them), with a cgroup in the step's leaf (it does not). Alone and beside
# the sleeping processes in alternating blocks, so that a drifting load weighs on both.
direct, alone_waits, crowded_waits = [], [], []
for block in range(3):
    d, w = spawn_waits(max(1, REPS // 3))
    direct += d
    alone_waits += w
    sleepers = [subprocess.Popen(["sleep", "600"]) for _ in range(n)]
    try:
        if block == 0:
            crowded = runner_cpu(idle_s)
        d, w = spawn_waits(max(1, REPS // 3))
        direct += d
        crowded_waits += w
    finally:
        for p in sleepers:
            p.kill()
        for p in sleepers:
            p.wait()
row(f"spawn --wait beside {n} processes", crowded_waits,
    [("Pi directly", direct), ("spawn --wait alone (target ratio <= 1.10)", alone_waits)])
print(f"{'idle runner CPU, % of a core':<44} beside {n} processes {crowded:.3f}%   alone {alone:.3f}%   "
      f"ratio {crowded / max(alone, 1e-6):.2f} (target <= 0.05%)")
print(f"load average at end {' '.join(load())}")
if PUEUE:
    pueued.kill()
PY
