#!/usr/bin/env bash
# Host emulation of the grouped MoE prefill kernels (moe_group, moe_gemm + __down) for every
# format, without a GPU: see README.md. Needs g++ (C++17) and python3 with jinja2.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-$(mktemp -d)}"
mkdir -p "$out"
python3 "$here/render.py" "$out"
cp "$here/emu.h" "$out/"
g++ -O2 -std=c++17 -I"$out" "$here/gemm_bf16.cpp" -o "$out/gemm_bf16"
"$out/gemm_bf16"
qs=(q4_0 q8_0 q4_k q6_k)
for i in 0 1 2 3; do
    g++ -O2 -std=c++17 -I"$out" -DQK=$i -DGEMM_INC="\"gemm_${qs[$i]}.inc\"" "$here/moe_kernels.cpp" -o "$out/moe_${qs[$i]}"
    "$out/moe_${qs[$i]}"
done
