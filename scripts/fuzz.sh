#!/usr/bin/env bash
# Fuzzes what comes from outside (fuzz/: spec, live_xml, records, authority) with cargo-fuzz on
# the nightly toolchain, FUZZ_SECONDS per target (default 600), from the committed corpus in
# fuzz/corpus/. New interesting inputs land in fuzz/corpus/<target>; crashes in
# fuzz/artifacts/<target>.
# `cargo test` replays the committed corpus on the pinned toolchain (src/fuzzing.rs), and CI
# checks that the targets build (scripts/test.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${FUZZ_SECONDS:-600}
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(spec live_xml records authority)
command -v cargo-fuzz >/dev/null || cargo install --locked cargo-fuzz@0.13.2
mkdir -p fuzz/logs
for t in "${targets[@]}"; do
  log=fuzz/logs/$t.log
  echo "fuzz: $t for ${seconds}s (log: $log)"
  if ! cargo +nightly fuzz run "$t" "fuzz/corpus/$t" -- -max_total_time="$seconds" \
      -rss_limit_mb=2048 -max_len=1100000 >"$log" 2>&1; then
    tail -40 "$log"
    echo "fuzz: $t FAILED (the input is in fuzz/artifacts/$t)"
    exit 1
  fi
  grep -E '^#[0-9]+' "$log" | tail -1
done
