#!/usr/bin/env bash
# The test command. Installs what the tests need into ./.cache (NVRTC for PTX snapshot tests,
# pinned real assets), then runs the whole workspace test suite. Safe to re-run; cached.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
cache="$root/.cache"
mkdir -p "$cache"

# NVRTC 13.0.88 from PyPI (no GPU needed): PTX snapshot tests must run, never skip.
nvrtc_dir="$cache/nvrtc"
if [ ! -e "$nvrtc_dir/nvidia/cu13/lib/libnvrtc.so.13" ]; then
  python3 -m pip install --quiet --disable-pip-version-check --no-deps \
    --target "$nvrtc_dir" nvidia-cuda-nvrtc==13.0.88
fi
export LD_LIBRARY_PATH="$nvrtc_dir/nvidia/cu13/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export FUCINA_REQUIRE_NVRTC=1

# Official OpenAI / Anthropic Python SDKs for tests/server_sdk.rs (pinned; no GPU, PyPI only).
pyenv="$cache/pyenv"
sdk_stamp="$pyenv/.fucina-openai-3.51.0-anthropic-2.10.0"
if [ ! -e "$sdk_stamp" ]; then
  python3 -m pip install --quiet --disable-pip-version-check --upgrade --target "$pyenv" \
    openai==3.51.0 anthropic==2.10.0
  touch "$sdk_stamp"
fi
export FUCINA_PYENV="$pyenv"

# Pinned test assets (checksummed); see scripts/fetch-assets.sh.
bash scripts/fetch-assets.sh "$cache/assets"
export FUCINA_TEST_ASSETS="$cache/assets"

cargo test --workspace "$@"

# Generated kernels: snapshots of every rendered instance and of the representative PTX set are
# current, and every instance compiles (fails naming `cargo xtask gen-kernels` when stale).
cargo xtask gen-kernels --check
