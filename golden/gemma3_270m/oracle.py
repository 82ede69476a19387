#!/usr/bin/env python3
"""Independent reference for the Gemma 3 270M Q4_K_M GGUF: a small numpy forward pass.

It shares no code with fucina: weights are dequantised by the `gguf` Python package
(`pip install gguf==0.19.0 numpy`) and the forward is written from the HF transformers 5.17
`Gemma3ForCausalLM` semantics with llama.cpp's GGUF conventions (norm weights already hold
1 + w, tied LM head, sliding layers every layer except each 6th, local RoPE base 10000, global
base `gemma3.rope.freq_base`). Everything is computed in float64, without a KV cache (each step
re-runs the whole sequence), so it is slow but leaves nothing to share with the engine.

Prompts are plain-word texts tokenised by whole-word lookup in the GGUF vocabulary (the first
word without the SentencePiece space marker, the others with it), after BOS; the script checks
every word is a single vocabulary entry. Output: `reference.json` with, per prompt, the prompt
ids, 16 greedy continuation ids, and the top-1 minus top-2 logit margin at each step, so the
Rust test compares only the steps before the reference's first near tie.

Usage: python3 oracle.py PATH/TO/gemma-3-270m-q4_k_m.gguf [out.json]
"""

import hashlib
import json
import math
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

PROMPTS = [
    "The capital of France is",
    "Once upon a time there was a little",
    "The quick brown fox jumps over the lazy",
    "My favorite food is",
    "Water boils at a temperature of",
]
STEPS = 16


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class Gemma3:
    def __init__(self, path):
        r = GGUFReader(path)
        assert r.fields["general.architecture"].contents() == "gemma3"
        meta = lambda k: r.fields[f"gemma3.{k}"].contents()  # noqa: E731
        self.n_layer = meta("block_count")
        self.hidden = meta("embedding_length")
        self.n_head = meta("attention.head_count")
        self.n_kv = meta("attention.head_count_kv")
        self.head_dim = meta("attention.key_length")
        self.eps = meta("attention.layer_norm_rms_epsilon")
        self.window = meta("attention.sliding_window")
        self.theta_global = meta("rope.freq_base")
        self.theta_local = 10000.0
        self.tensors = {t.name: t for t in r.tensors}
        toks = r.fields["tokenizer.ggml.tokens"]
        self.vocab = [bytes(toks.parts[i]).decode("utf-8") for i in toks.data]
        self.bos = int(r.fields["tokenizer.ggml.bos_token_id"].contents())
        self.cache = {}

    def w(self, name):
        if name not in self.cache:
            t = self.tensors[name]
            self.cache[name] = dequantize(t.data, t.tensor_type).astype(np.float64)
        return self.cache[name]

    def tokenize(self, text):
        index = {s: i for i, s in enumerate(self.vocab)}
        ids = [self.bos]
        for n, word in enumerate(text.split(" ")):
            piece = word if n == 0 else "\u2581" + word
            if piece not in index:
                raise SystemExit(f"{piece!r} is not one vocabulary entry; choose another prompt")
            ids.append(index[piece])
        return ids

    def rms(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def rope(self, x, theta):
        # x: [T, heads, hd]; NEOX pairing (i, i + hd/2), as HF's rotate_half.
        t, _, hd = x.shape
        half = hd // 2
        inv = theta ** (-np.arange(half, dtype=np.float64) * 2.0 / hd)
        ang = np.arange(t, dtype=np.float64)[:, None] * inv[None, :]
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        a, b = x[..., :half], x[..., half:]
        return np.concatenate([a * c - b * s, a * s + b * c], axis=-1)

    def forward(self, ids):
        t = len(ids)
        hd, nh, nkv = self.head_dim, self.n_head, self.n_kv
        emb = self.w("token_embd.weight")
        x = emb[ids] * math.sqrt(self.hidden)
        pos = np.arange(t)
        causal = pos[None, :] <= pos[:, None]
        for il in range(self.n_layer):
            p = f"blk.{il}."
            sliding = (il + 1) % 6 != 0
            theta = self.theta_local if sliding else self.theta_global
            mask = causal & (pos[None, :] > pos[:, None] - self.window) if sliding else causal
            h = self.rms(x, self.w(p + "attn_norm.weight"))
            q = (h @ self.w(p + "attn_q.weight").T).reshape(t, nh, hd)
            k = (h @ self.w(p + "attn_k.weight").T).reshape(t, nkv, hd)
            v = (h @ self.w(p + "attn_v.weight").T).reshape(t, nkv, hd)
            q = self.rope(self.rms(q, self.w(p + "attn_q_norm.weight")), theta)
            k = self.rope(self.rms(k, self.w(p + "attn_k_norm.weight")), theta)
            out = np.zeros((t, nh, hd))
            for head in range(nh):
                kh = head // (nh // nkv)
                s = (q[:, head, :] @ k[:, kh, :].T) / math.sqrt(hd)
                s = np.where(mask, s, -np.inf)
                s = np.exp(s - s.max(axis=-1, keepdims=True))
                s /= s.sum(axis=-1, keepdims=True)
                out[:, head, :] = s @ v[:, kh, :]
            o = out.reshape(t, nh * hd) @ self.w(p + "attn_output.weight").T
            x = x + self.rms(o, self.w(p + "post_attention_norm.weight"))
            h = self.rms(x, self.w(p + "ffn_norm.weight"))
            g = h @ self.w(p + "ffn_gate.weight").T
            g = 0.5 * g * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (g + 0.044715 * g**3)))
            f = (g * (h @ self.w(p + "ffn_up.weight").T)) @ self.w(p + "ffn_down.weight").T
            x = x + self.rms(f, self.w(p + "post_ffw_norm.weight"))
        x = self.rms(x[-1:], self.w("output_norm.weight"))
        return (x @ emb.T)[0]


def main():
    path = sys.argv[1]
    out_path = sys.argv[2] if len(sys.argv) > 2 else "reference.json"
    model = Gemma3(path)
    cases = []
    for text in PROMPTS:
        ids = model.tokenize(text)
        seq, greedy, margins = list(ids), [], []
        for _ in range(STEPS):
            logits = model.forward(seq)
            top = np.argsort(logits)[::-1][:2]
            greedy.append(int(top[0]))
            margins.append(round(float(logits[top[0]] - logits[top[1]]), 5))
            seq.append(int(top[0]))
        print(text, "->", repr("".join(model.vocab[i] for i in greedy).replace("\u2581", " ")), margins)
        cases.append({"text": text, "prompt_ids": ids, "greedy_ids": greedy, "top2_margins": margins})
    doc = {
        "model": "gemma-3-270m-q4_k_m.gguf",
        "sha256": sha256(path),
        "reference": "golden/gemma3_270m/oracle.py (numpy float64 forward over gguf==0.19.0 dequantize)",
        "steps": STEPS,
        "cases": cases,
    }
    with open(out_path, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
