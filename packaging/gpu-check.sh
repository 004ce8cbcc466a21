#!/usr/bin/env bash
# The prepared GPU check for the lent H200 machine (see ../shared/device/README.md): builds
# against the PyTorch LibTorch 2.x (CUDA) with NCCL and without the GUI, runs the gpu label and the
# benchmarks (FLUX.1-dev size; then the per-family table of packaging/bench-configs/ with device
# times and the step breakdown by CUDA events), and writes everything under $OUT.
# Usage: OUT=/some/dir bash packaging/gpu-check.sh
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
TP=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')
MPI_INC=/usr/lib/x86_64-linux-gnu/openmpi/include
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$TP" \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DDITSTUDIO_BUILD_GUI=OFF -DDITSTUDIO_WITH_NCCL=ON \
  > "$OUT/configure.txt" 2>&1 || { tail -40 "$OUT/configure.txt"; exit 1; }
cmake --build build-gpu -j16 > "$OUT/build.txt" 2>&1 || { grep -E "error" "$OUT/build.txt" | head -40; exit 1; }
ctest --test-dir build-gpu -L gpu --output-on-failure > "$OUT/ctest-gpu.txt" 2>&1; tail -30 "$OUT/ctest-gpu.txt"
B=build-gpu/bin/ditstudio-bench
for size in 1024 2048; do
  $B --config packaging/flux1-dev-transformer-config.json --random-weights --dtype bfloat16 \
     --device cuda --width $size --height $size --text-len 512 --steps 10 --warmup 3 \
     --peak-tflops 989 > "$OUT/bench-flux-dev-$size.json" 2> "$OUT/bench-flux-dev-$size.err"
  cat "$OUT/bench-flux-dev-$size.json" | head -40
done
# The per-family table (issue 49): each config of packaging/bench-configs/ (the CPU peer table's
# models) on the GPU, bf16 and fp32, at the CPU table's 256x256 and at 1024x1024, 64 text tokens.
# device_step_ms: CUDA events around each step (no host synchronisation inside it); the category
# percentages: the --profile step by device events (bench_profile.h), % of its device time.
printf 'family\tdtype\tsize\timage_tokens\tparams\tstep_ms_median\tdevice_step_ms_median\tachieved_tflops\tgemm%%\tattention%%\tnorm_mod%%\trope%%\tcopy%%\telementwise%%\tcollective%%\tother%%\n' |
  tee "$OUT/family-table.tsv"
for cfg in packaging/bench-configs/*.json; do
  f=$(basename "$cfg" .json)
  for dt in bfloat16 float32; do
    for size in 256 1024; do
      j="$OUT/bench-$f-$dt-$size.json"
      if ! timeout 300 $B --config "$cfg" --random-weights --dtype $dt --device cuda --width $size \
        --height $size --text-len 64 --steps 10 --warmup 3 --profile > "$j" 2> "${j%.json}.err"; then
        echo "$f $dt $size: failed: $(tail -1 "${j%.json}.err")"; continue
      fi
      python3 - "$f" "$dt" "$size" "$j" <<'PY' | tee -a "$OUT/family-table.tsv"
import json, sys
f, dt, size, path = sys.argv[1:5]
j = json.load(open(path))
p = j.get("op_profile") or {}
frac = p.get("device_categories_fraction") or p.get("categories_fraction") or {}
dev = (j.get("device_step_ms") or {}).get("median")
cats = ["gemm", "attention", "norm_modulation", "rope", "copy_layout", "elementwise", "collective", "other"]
row = [f, dt, size, j["image_tokens"], j["config"]["parameters"], "%.2f" % j["step_ms"]["median"],
       "-" if dev is None else "%.2f" % dev, "%.2f" % j["achieved_tflops_total"]]
print("\t".join(map(str, row + ["%.1f" % (100 * frac.get(c, 0.0)) for c in cats])))
PY
    done
  done
done
