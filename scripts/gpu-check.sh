#!/usr/bin/env bash
# GPU checks and benchmarks on the device machine (H200), one stage per call:
#   scripts/gpu-check.sh selftest            kernel + backend-op + model tables
#   scripts/gpu-check.sh bench NAME QUANT    synthesise NAME at QUANT, measure, delete the file
#   scripts/gpu-check.sh serve MODEL.gguf    server on the GPU answering the OpenAI SDK
#   scripts/gpu-check.sh gemm                prefill GEMM bench (examples/gemm_bench, binary at
#                                            $GEMM_BENCH, default /tmp/gemm_bench)
# Expects the release binary at $FUCINA (default /tmp/fucina) and writes logs under $OUT.
set -u
FUCINA=${FUCINA:-/tmp/fucina}
OUT=${OUT:-/tmp/out}
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export FUCINA_CACHE_DIR=${FUCINA_CACHE_DIR:-/tmp/fucina-cache}
mkdir -p "$OUT"
case "${1:-}" in
selftest)
    "$FUCINA" selftest --iters 10 >"$OUT/selftest.log" 2>&1
    echo "selftest rc=$?"
    grep -E "instances,|checks,|model|FAIL" "$OUT/selftest.log" | tail -40
    ;;
bench)
    name=$2 quant=$3 file=/tmp/$2-$3.gguf
    shift 3
    "$FUCINA" bench --synth "$name" --quant "$quant" --synth-out "$file" \
        --prompt-lens 512,4096 --decode-tokens 128 --depths 0,4096 \
        --json "$OUT/bench-$name-$quant.json" "$@" >"$OUT/bench-$name-$quant.log" 2>&1
    echo "bench $name $quant rc=$?"
    tail -25 "$OUT/bench-$name-$quant.log"
    rm -f "$file"
    ;;
serve)
    model=$2 port=18080
    # the device has no network: the SDK comes from wheels carried in .whl/ (made here with
    # `pip download --only-binary :all: --python-version 3.12 --platform manylinux2014_x86_64
    # openai -d .whl`)
    python3 -c 'import openai' 2>/dev/null ||
        python3 -m pip install -q --no-index --find-links .whl openai >"$OUT/pip.log" 2>&1
    "$FUCINA" -m "$model" --device cuda --port $port >"$OUT/serve.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 120); do
        curl -sf "http://127.0.0.1:$port/v1/models" >/dev/null && break
        sleep 1
    done
    python3 - "$port" <<'PY' 2>&1 | tee "$OUT/sdk.log"
import sys, openai
port = sys.argv[1]
c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x")
m = c.models.list().data[0].id
r = c.chat.completions.create(model=m, messages=[{"role": "user", "content": "Name three colours."}],
                              max_tokens=32, temperature=0)
print("chat:", repr(r.choices[0].message.content), r.usage)
parts = []
for ch in c.chat.completions.create(model=m, messages=[{"role": "user", "content": "Count to five."}],
                                    max_tokens=24, temperature=0.7, seed=3, stream=True):
    if ch.choices and ch.choices[0].delta.content:
        parts.append(ch.choices[0].delta.content)
print("stream:", repr("".join(parts)))
r = c.completions.create(model=m, prompt="The capital of France is", max_tokens=8, temperature=0)
print("completion:", repr(r.choices[0].text))
PY
    kill $pid 2>/dev/null
    wait $pid 2>/dev/null
    grep -iE "error|panic|context|loading|tok/s" "$OUT/serve.log" | tail -15
    ;;
gemm)
    "${GEMM_BENCH:-/tmp/gemm_bench}" >"$OUT/gemm_bench.log" 2>&1
    echo "gemm_bench rc=$?"
    cat "$OUT/gemm_bench.log"
    ;;
*)
    echo "usage: $0 selftest | bench NAME QUANT [args] | serve MODEL.gguf | gemm" >&2
    exit 2
    ;;
esac
