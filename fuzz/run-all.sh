#!/usr/bin/env bash
# Runs every fuzz target for SECONDS seconds each (default 180) on this stable toolchain.
#
#   fuzz/run-all.sh [SECONDS]
#
# cargo-fuzz passes nightly-only flags (-Zsanitizer=address); RUSTC_BOOTSTRAP=1 lets the
# stable compiler accept them. Install cargo-fuzz once: cargo install cargo-fuzz --locked
set -euo pipefail
cd "$(dirname "$0")"
secs="${1:-180}"
export RUSTC_BOOTSTRAP=1
for target in rules_parse codec_plain codec_route codec_baggage edge_strip forwarded path_normalize; do
    mkdir -p "corpus/$target"
    echo "==> $target for ${secs}s"
    cargo fuzz run "$target" "corpus/$target" "seeds/$target" -- \
        -max_total_time="$secs" -max_len=4096 -timeout=10 -rss_limit_mb=2048 2>&1 \
        | grep -E "^(#[0-9]+ +DONE|Done [0-9]+ runs|==[0-9]+==ERROR|SUMMARY|artifact_prefix)" || true
    if compgen -G "artifacts/$target/*" >/dev/null; then
        echo "!! $target found a crash: see fuzz/artifacts/$target/" >&2
        exit 1
    fi
done
echo "all fuzz targets ran ${secs}s each without a finding"
