#!/usr/bin/env bash
# The long fault and soak run (CI runs the same tests with small counts as part of
# `cargo test`): in one real TCG guest whose launcher runs in a device-restricted cgroup,
#   - 1000 attach/detach cycles of a file and a block (loop) volume: 0 leaked device nodes,
#     cgroup rules, launcher file descriptors or libvirt devices; RSS start/end printed and
#     held flat;
#   - 8 concurrent Syncs with different specs end in the state of the last one;
#   - 200 pause/unpause cycles with no gap in the event stream;
#   - libvirtd killed (SIGKILL) during an attach, then the same Sync converges;
# then, ROUNDS times (default 5), tests/guests/restart.rs: the launcher killed (SIGKILL) between
# Syncs and in the middle of one, restarted, converging with nothing unplugged; a pending volume
# across a guest restart; SIGTERM and Kill interrupting a Sync;
# then MIGRATIONS (default 20) live-migration round trips of one guest between launchers
# (tests/guests/local_migration.rs: one boot id from the first hop to the last).
# Figures are the lines starting with SOAK. Needs what scripts/setup.sh installs; ~5–8 min.
#   scripts/soak.sh [CYCLES [PAUSES [ROUNDS [MIGRATIONS]]]]
set -euo pipefail
cd "$(dirname "$0")/.."
cycles=${1:-1000}
pauses=${2:-200}
rounds=${3:-5}
migrations=${4:-20}
started=$(date +%s)
VMLAUNCHER_SOAK_CYCLES=$cycles VMLAUNCHER_SOAK_PAUSES=$pauses \
  cargo test --locked --test guests soak:: -- --nocapture 2>&1 | grep -E '^SOAK|^test |panicked|result:'
for i in $(seq 1 "$rounds"); do
  echo "SOAK restart round $i/$rounds"
  cargo test --locked --test guests restart:: -- --nocapture --test-threads 1 2>&1 \
    | grep -E 'killed with|^restarted and|^Sync interrupted|^test |panicked|result:'
done
echo "SOAK migration round trips: $migrations"
VMLAUNCHER_MIGRATION_ROUNDS=$migrations \
  cargo test --locked --test guests local_migration::a_guest_goes_back_and_forth -- --nocapture 2>&1 \
  | grep -E '^test |panicked|result:'
echo "SOAK done in $(( $(date +%s) - started ))s"
