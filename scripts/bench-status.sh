#!/bin/sh
# Benchmark cohort-status at 1,000 / 10,000 / 100,000 runs (release build). Not run by
# `cargo test`. Sizes: COHORT_BENCH_SIZES=1000,10000,100000; scratch: COHORT_BENCH_DIR.
# See cohort-status/benches/status.rs for what is measured.
set -eu
cd "$(dirname "$0")/.."
exec cargo bench -p cohort-status --bench status "$@"
