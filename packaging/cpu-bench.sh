#!/usr/bin/env bash
# The CPU figures of docs/performance.md: per-rank weight memory under tp 1/2/4, step
# time per strategy, and bytes communicated per step against the closed-form volume each strategy
# must move. Usage (from the repository root, after building): bash packaging/cpu-bench.sh [build]
# Needs jq (installed by packaging/install-deps.sh). Times are wall-clock on this machine's cores;
# with more ranks than cores (oversubscribed) multi-rank step times are not speedups.
# Each row also names the attention kernel that ran (math: unfused, LibTorch 1.13 or where no
# fused kernel applies; flash_cpu: LibTorch 2.x's fused CPU kernel), the LibTorch version and
# OpenBLAS's kernel family (openblas_get_corename). Debian 12's OpenBLAS may pick "Prescott"
# kernels on CPUs it does not recognise: OPENBLAS_CORETYPE=Cooperlake (or Haswell, SkylakeX)
# forces a family, for figures comparable across builds.
set -euo pipefail
B=${1:-build}/bin/ditstudio-bench
FIX=tests/data/tiny-flux-A
CFG=$(mktemp --suffix=.json)
trap 'rm -f "$CFG"' EXIT
# A larger FLUX.1-architecture transformer defined by its config alone (73.4 M parameters).
cat > "$CFG" <<'JSON'
{"_class_name": "FluxTransformer2DModel", "attention_head_dim": 64, "axes_dims_rope": [8, 28, 28],
 "guidance_embeds": true, "in_channels": 64, "joint_attention_dim": 512, "num_attention_heads": 8,
 "num_layers": 4, "num_single_layers": 8, "out_channels": null, "patch_size": 1,
 "pooled_projection_dim": 256}
JSON
run() {  # np, label, args...
  local np=$1 label=$2; shift 2
  mpirun --allow-run-as-root --oversubscribe -np "$np" -x OMP_NUM_THREADS=1 "$B" "$@" 2>/dev/null |
    jq -r --arg l "$label" '[$l, .image_tokens, .text_tokens, (.step_ms.median // 0 | floor),
      (.ranks | map(.weight_bytes) | max / 1048576 * 100 | floor / 100),
      (.ranks | map(.rss_peak_load_growth_bytes) | max / 1048576 * 10 | floor / 10),
      (.ranks | map(.bytes_sent_per_step) | max), (.ranks | map(.expected_bytes_per_step) | max),
      (.attention_kernels // [] | if length == 0 then "-" else join("+") end),
      (.torch_version // "?"), (.blas_core // "none")] | @tsv'
}
printf 'strategy\timg_tokens\ttxt_tokens\tstep_ms_median\tweights_MiB_per_rank\tload_peak_growth_MiB\tbytes_sent_per_step\texpected_bytes_per_step\tattention_kernel\tlibtorch\topenblas_core\n'
for tp in 1 2 4; do
  run $tp "fixture tp$tp" --model $FIX --width 64 --height 64 --text-len 16 --dtype float32 --steps 5 --warmup 1 --tp-degree $tp
done
for tp in 1 2 4; do
  run $tp "larger tp$tp (load)" --config "$CFG" --random-weights --width 256 --height 256 --text-len 64 --dtype float32 --phase load --tp-degree $tp
done
L=(--config "$CFG" --random-weights --width 256 --height 256 --text-len 64 --dtype float32 --steps 3 --warmup 1)
run 1 "larger 1 rank" "${L[@]}"
run 2 "larger tp2" "${L[@]}" --tp-degree 2
run 2 "larger ulysses2" "${L[@]}" --ulysses-degree 2
run 2 "larger ring2" "${L[@]}" --ring-degree 2
run 4 "larger unified2x2" "${L[@]}" --ring-degree 2 --ulysses-degree 2
run 2 "larger cfg2" "${L[@]}" --cfg-degree 2
run 4 "larger tp2xulysses2" "${L[@]}" --tp-degree 2 --ulysses-degree 2
