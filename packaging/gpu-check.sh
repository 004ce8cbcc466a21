#!/usr/bin/env bash
# The prepared GPU check for the lent H200 machine (see ../shared/device/README.md): builds
# against the PyTorch LibTorch 2.x (CUDA) with NCCL and without the GUI, runs the gpu label and the
# benchmarks, and writes everything under $OUT. Usage: OUT=/some/dir bash packaging/gpu-check.sh
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
