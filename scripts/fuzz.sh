#!/usr/bin/env bash
# Runs every coverage-guided fuzz target of fuzz/ for SECONDS each (default 60): the amount,
# byte-size and resource-spec parsers, scaling config files (TOML and JSON), and the agent
# protocol's framing and decoding. Seeds come from fuzz/corpus/<target> (committed); what a
# run discovers goes to a temp dir. The random seed is fixed, so that a run on a machine no
# faster than the last one explores no more than it did: CI fails on a bug, not on luck. A crash fails the script and leaves its input under
# fuzz/artifacts/<target>/: commit it to the corpus and fix the bug.
#
# Needs the nightly toolchain (sanitizers) and cargo-fuzz, installed from crates.io when
# missing. Exit codes: 0 no crash; 1 a crash or a build failure; 3 SKIP (no nightly
# toolchain, or cargo-fuzz cannot be installed).
set -euo pipefail
cd "$(dirname "$0")/.."
NAME="fuzz"
# shellcheck source=messages.sh
. scripts/messages.sh

SECONDS_EACH="${1:-60}"
CARGO_FUZZ_VERSION="0.13.2"

rustup toolchain list 2>/dev/null | grep -q '^nightly' \
  || skip "no nightly toolchain (rustup toolchain install nightly): the fuzz targets are not run"
if ! cargo fuzz --version >/dev/null 2>&1; then
  log "installing cargo-fuzz ${CARGO_FUZZ_VERSION}"
  cargo install --locked --quiet cargo-fuzz --version "$CARGO_FUZZ_VERSION" \
    || skip "cargo-fuzz cannot be installed from the registry"
fi

cd fuzz
targets=$(cargo +nightly fuzz list)
log "building the targets"
cargo +nightly fuzz build >/dev/null 2>&1 || { cargo +nightly fuzz build; die "the fuzz targets do not build"; }
found=$(mktemp -d)
trap 'rm -rf "$found"' EXIT
for target in $targets; do
  mkdir -p "$found/$target" "corpus/$target"
  log "$target: ${SECONDS_EACH}s"
  cargo +nightly fuzz run "$target" "$found/$target" "corpus/$target" -- \
    -seed=1 -max_total_time="$SECONDS_EACH" -max_len=4096 -print_final_stats=1 2>&1 \
    | grep -E '^(stat::number_of_executed_units|stat::new_units_added|==[0-9]+==|SUMMARY|Failing input|panicked)' \
    || true
  if [ -n "$(ls -A "artifacts/$target" 2>/dev/null)" ]; then
    die "$target found a crash: see fuzz/artifacts/$target/"
  fi
done
log "no crash in $(echo "$targets" | wc -w) targets, ${SECONDS_EACH}s each"
