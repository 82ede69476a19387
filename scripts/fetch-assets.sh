#!/usr/bin/env bash
# Fetches the pinned real assets the tests use into DIR (default .cache/assets), verifying
# sha256 checksums. Nothing here is committed; everything comes from package registries.
set -euo pipefail
dir=${1:-.cache/assets}
mkdir -p "$dir"
# (asset steps are appended by the issues that need them)
echo "assets in $dir"
