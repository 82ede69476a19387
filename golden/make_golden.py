#!/usr/bin/env python3
"""Golden model cases: tiny random checkpoints and the logits HF transformers computes for them.

For every case this writes, under OUT/models/<case>/:
  hf/config.json, hf/model.safetensors   the checkpoint as transformers saves it (float32)
  model.gguf                              the same weights in llama.cpp's GGUF layout (if any)
  golden.json                             HF logits for fixed token sequences, greedy
                                          continuations, and provenance

Every parameter is randomised (norm weights, A_log, dt_bias, conv, routers ...) so that a
`w` vs `1 + w` mistake or a wrong head order changes the logits. The reference is HF
transformers run on the CPU in float32 with eager attention.

Run where torch and transformers (5.17) are installed, plus the `gguf` package (the committed
files were made on a CPU with torch 2.11.0, transformers 5.17.0, gguf 0.19.0, from PyPI:
`python -m venv /tmp/tenv && /tmp/tenv/bin/pip install torch==2.11.0 transformers==5.17.0
gguf==0.19.0`); the output is deterministic for a given seed:
    python golden/make_golden.py --out /tmp/golden [--only qwen3,qwen35]
    cp -r /tmp/golden/models/<case> golden/models/
Other families add cases in golden/gemma_cases.py, which defines `register(mg)`; `mg` is this
module, so it can use `Case`, `randomize`, `GgufOut` and `add_case`.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import math
import os
import platform
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

SEED = 1234
TOLERANCE = 1e-3
METRIC = (
    "per position: max_i |cpu_i - hf_i| / max_i |hf_i| over the vocabulary; "
    "the test takes the maximum over positions and sequences"
)
# Token sequences (ids < every case's vocab size of 256). A single token, a short run, and a
# longer one with repeats (longer than the GDN conv kernel).
SEQUENCES = [
    [12, 200, 37, 5, 91, 144, 3, 77, 250, 18],
    [1],
    [60, 60, 61, 62, 60, 60, 61, 62, 9, 10, 11, 12, 13, 14, 15, 16, 100, 101, 102],
]
GREEDY_FROM = [0, 2]  # indices of SEQUENCES continued greedily
GREEDY_STEPS = 8


@dataclass
class Case:
    """One golden case.

    name: folder under golden/models/ (also the test's case name).
    arch: the registry's architecture name (fucina `Arch::name()`), e.g. "qwen35".
    layout: "hf-text" (tensors under `model.`) or "hf-multimodal" (`model.language_model.`).
    build: returns the HF model (called after the global seed is set).
    zero_centred: names of parameters that are applied as (1 + w) (so they are drawn around 0);
        every other norm weight is drawn around 1.
    gguf: optional writer of the GGUF layout: f(model, config, GgufOut).
    """

    name: str
    arch: str
    layout: str
    build: Callable[[], torch.nn.Module]
    zero_centred: Callable[[str], bool] = lambda name: False
    gguf: Callable | None = None
    gguf_arch: str | None = None
    notes: str = ""
    sequences: list = field(default_factory=lambda: SEQUENCES)


CASES: list[Case] = []


def add_case(case: Case) -> None:
    CASES.append(case)


# ---------------------------------------------------------------------------------------------
# randomisation


def randomize(model: torch.nn.Module, seed: int, zero_centred: Callable[[str], bool]) -> None:
    """Give every parameter a random value with a scale that keeps activations O(1)."""
    g = torch.Generator().manual_seed(seed)

    def normal(shape, std, mean=0.0):
        return torch.randn(shape, generator=g, dtype=torch.float32) * std + mean

    with torch.no_grad():
        for name, p in model.named_parameters():
            shape = tuple(p.shape)
            leaf = name.rsplit(".", 1)[-1]
            if "norm" in name and p.ndim == 1:
                v = normal(shape, 0.3) if zero_centred(name) else normal(shape, 0.3, 1.0)
            elif leaf == "A_log":
                v = torch.log(torch.rand(shape, generator=g) * 3.5 + 0.5)
            elif leaf == "dt_bias":
                v = normal(shape, 0.5)
            elif "conv1d" in name:
                v = normal(shape, 0.5)
            elif "embed" in name and "patch" not in name:
                v = normal(shape, 1.0)
            elif name.endswith("mlp.gate.weight") or "router" in name:
                # decisive routing: no near-ties at the top-k boundary
                v = normal(shape, 3.0 / math.sqrt(shape[-1]))
            elif p.ndim >= 2:
                fan_in = int(np.prod(shape[1:]))
                v = normal(shape, 1.0 / math.sqrt(fan_in))
            else:
                v = normal(shape, 0.2)
            p.copy_(v.to(p.dtype))


# ---------------------------------------------------------------------------------------------
# GGUF output


class GgufOut:
    """Collects tensors (numpy, PyTorch axis order) and metadata, then writes a GGUF file."""

    def __init__(self, arch: str):
        import gguf
        import gguf.quants  # noqa: F401

        self.gguf = gguf
        self.arch = arch
        self.tensors: list[tuple[str, np.ndarray]] = []
        self.kv: list[tuple[str, object]] = []

    def t(self, name: str, x) -> None:
        if isinstance(x, torch.Tensor):
            x = x.detach().to(torch.float32).cpu().numpy()
        self.tensors.append((name, np.ascontiguousarray(x.astype(np.float32))))

    def meta(self, method: str, *args) -> None:
        self.kv.append((method, args))

    def write(self, path: Path, q8_0: bool = False) -> None:
        """Write F32, or (q8_0) with every matrix whose rows are whole 32-blocks in Q8_0 (the
        `gguf` package's reference quantiser), vectors and small tensors staying F32."""
        gq = self.gguf.GGMLQuantizationType
        w = self.gguf.GGUFWriter(str(path), self.arch)
        w.add_name("fucina golden " + self.arch)
        w.add_file_type(self.gguf.LlamaFileType.MOSTLY_Q8_0 if q8_0 else self.gguf.LlamaFileType.ALL_F32)
        for method, args in self.kv:
            getattr(w, method)(*args)
        for name, arr in self.tensors:
            if q8_0 and q8_0_eligible(name, arr):
                w.add_tensor(name, self.gguf.quants.quantize(arr, gq.Q8_0), raw_dtype=gq.Q8_0)
            else:
                w.add_tensor(name, arr)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()


# Q8_0 variant: a matrix is stored in Q8_0 when its rows are whole 32-blocks, except tensors whose
# GGUF column order differs from HF's (ssm_out's columns are value heads re-ordered in groups of
# head_dim < 32, so its blocks would not be HF's blocks).
Q8_KEEP_GGUF = ("ssm_out",)
# The HF parameters that become those Q8_0 tensors are rounded through Q8_0 before the reference
# logits are computed, so the reference has exactly the GGUF's weight values.
Q8_KEEP_HF = ("linear_attn.out_proj", "shared_expert_gate", "visual")


def q8_0_eligible(gguf_name: str, arr: np.ndarray) -> bool:
    return arr.ndim >= 2 and arr.shape[-1] % 32 == 0 and not any(k in gguf_name for k in Q8_KEEP_GGUF)


def round_trip_q8_0(model: torch.nn.Module) -> None:
    import gguf
    import gguf.quants

    q = gguf.GGMLQuantizationType.Q8_0
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2 and p.shape[-1] % 32 == 0 and not any(k in name for k in Q8_KEEP_HF):
                a = p.detach().cpu().numpy().astype(np.float32)
                p.copy_(torch.from_numpy(gguf.quants.dequantize(gguf.quants.quantize(a, q), q).reshape(a.shape)))


def _common_meta(out: GgufOut, c, n_layers: int, ff: int) -> None:
    out.meta("add_block_count", n_layers)
    out.meta("add_context_length", c.max_position_embeddings)
    out.meta("add_embedding_length", c.hidden_size)
    out.meta("add_feed_forward_length", ff)
    out.meta("add_head_count", c.num_attention_heads)
    out.meta("add_head_count_kv", c.num_key_value_heads)
    out.meta("add_key_length", c.head_dim)
    out.meta("add_value_length", c.head_dim)
    out.meta("add_layer_norm_rms_eps", c.rms_norm_eps)
    out.meta("add_rope_freq_base", float(c.rope_parameters["rope_theta"]))


def _sd(model) -> dict:
    return {k: v.detach().to(torch.float32).cpu() for k, v in model.state_dict().items()}


def _experts(out: GgufOut, sd: dict, p: str, i: int, ff: int) -> None:
    """Fused HF expert parameters -> llama.cpp's stacked banks [E, out, in]."""
    gu = sd[f"{p}layers.{i}.mlp.experts.gate_up_proj"]  # [E, 2ff, H], gate rows first
    out.t(f"blk.{i}.ffn_gate_exps.weight", gu[:, :ff, :])
    out.t(f"blk.{i}.ffn_up_exps.weight", gu[:, ff:, :])
    out.t(f"blk.{i}.ffn_down_exps.weight", sd[f"{p}layers.{i}.mlp.experts.down_proj"])
    out.t(f"blk.{i}.ffn_gate_inp.weight", sd[f"{p}layers.{i}.mlp.gate.weight"])


def _head(out: GgufOut, sd: dict, p: str, tied: bool, fold) -> None:
    out.t("token_embd.weight", sd[f"{p}embed_tokens.weight"])
    out.t("output_norm.weight", fold(sd[f"{p}norm.weight"]))
    if not tied:
        out.t("output.weight", sd["lm_head.weight"])


def gguf_qwen3(model, c, out: GgufOut) -> None:
    """llama.cpp `qwen3` / `qwen3moe`: plain norms, NEOX RoPE (no q/k permutation)."""
    sd = _sd(model)
    p = "model."
    moe = hasattr(c, "num_experts")
    _common_meta(out, c, c.num_hidden_layers, c.intermediate_size)
    out.meta("add_rope_dimension_count", c.head_dim)
    if moe:
        out.meta("add_expert_count", c.num_experts)
        out.meta("add_expert_used_count", c.num_experts_per_tok)
        out.meta("add_expert_feed_forward_length", c.moe_intermediate_size)
    _head(out, sd, p, c.tie_word_embeddings, lambda x: x)
    for i in range(c.num_hidden_layers):
        b = f"{p}layers.{i}."
        for hf, gg in [
            ("input_layernorm", "attn_norm"),
            ("post_attention_layernorm", "ffn_norm"),
            ("self_attn.q_proj", "attn_q"),
            ("self_attn.k_proj", "attn_k"),
            ("self_attn.v_proj", "attn_v"),
            ("self_attn.o_proj", "attn_output"),
            ("self_attn.q_norm", "attn_q_norm"),
            ("self_attn.k_norm", "attn_k_norm"),
        ]:
            out.t(f"blk.{i}.{gg}.weight", sd[b + hf + ".weight"])
        if moe:
            _experts(out, sd, p, i, c.moe_intermediate_size)
        else:
            for proj in ["gate", "up", "down"]:
                out.t(f"blk.{i}.ffn_{proj}.weight", sd[f"{b}mlp.{proj}_proj.weight"])


def _v_perm(nk: int, nv: int) -> np.ndarray:
    """llama.cpp's value-head order: GGUF head j*nk + k holds HF head k*(nv/nk) + j."""
    r = nv // nk
    return np.array([k * r + j for j in range(r) for k in range(nk)])


def _permute_heads(x: torch.Tensor, perm: np.ndarray, width: int, axis: int = 0) -> torch.Tensor:
    """Re-order groups of `width` entries along `axis` by `perm`."""
    idx = torch.tensor(np.concatenate([np.arange(h * width, (h + 1) * width) for h in perm]))
    return x.index_select(axis, idx)


def gguf_qwen35(model, c, out: GgufOut) -> None:
    """llama.cpp `qwen35` / `qwen35moe` (conventions of convert_hf_to_gguf's Qwen3NextModel and
    its V-head re-ordering): every `*norm.weight` except `linear_attn.norm` gets +1 folded in;
    ssm_a = -exp(A_log); dt_bias -> ssm_dt.bias; conv1d squeezed to [C, K]; value heads re-ordered
    from HF's grouped order to tiled order in every value-head tensor."""
    sd = _sd(model)
    p = "model."
    moe = hasattr(c, "num_experts")
    nk, nv = c.linear_num_key_heads, c.linear_num_value_heads
    dk, dv = c.linear_key_head_dim, c.linear_value_head_dim
    perm = _v_perm(nk, nv)
    rot = int(c.head_dim * c.rope_parameters.get("partial_rotary_factor", 0.25))
    _common_meta(out, c, c.num_hidden_layers, getattr(c, "intermediate_size", 0))
    out.meta("add_rope_dimension_count", rot)
    out.meta("add_rope_dimension_sections", list(c.rope_parameters.get("mrope_section", [rot // 2, 0, 0])) + [0])
    out.meta("add_ssm_conv_kernel", c.linear_conv_kernel_dim)
    out.meta("add_ssm_state_size", dk)
    out.meta("add_ssm_group_count", nk)
    out.meta("add_ssm_time_step_rank", nv)
    out.meta("add_ssm_inner_size", nv * dv)
    full = [i for i, t in enumerate(c.layer_types) if t == "full_attention"]
    out.meta("add_full_attention_interval", full[0] + 1 if full else 4)
    if moe:
        out.meta("add_expert_count", c.num_experts)
        out.meta("add_expert_used_count", c.num_experts_per_tok)
        out.meta("add_expert_feed_forward_length", c.moe_intermediate_size)
        out.meta("add_expert_shared_feed_forward_length", c.shared_expert_intermediate_size)
    plus1 = lambda x: x + 1.0
    _head(out, sd, p, c.tie_word_embeddings, plus1)
    for i, kind in enumerate(c.layer_types):
        b = f"{p}layers.{i}."
        out.t(f"blk.{i}.attn_norm.weight", plus1(sd[b + "input_layernorm.weight"]))
        out.t(f"blk.{i}.post_attention_norm.weight", plus1(sd[b + "post_attention_layernorm.weight"]))
        if kind == "full_attention":
            for hf, gg in [("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v"), ("o_proj", "attn_output")]:
                out.t(f"blk.{i}.{gg}.weight", sd[f"{b}self_attn.{hf}.weight"])
            out.t(f"blk.{i}.attn_q_norm.weight", plus1(sd[b + "self_attn.q_norm.weight"]))
            out.t(f"blk.{i}.attn_k_norm.weight", plus1(sd[b + "self_attn.k_norm.weight"]))
        else:
            la = b + "linear_attn."
            kd = nk * dk
            qkv = sd[la + "in_proj_qkv.weight"]
            qkv = torch.cat([qkv[: 2 * kd], _permute_heads(qkv[2 * kd :], perm, dv)], 0)
            out.t(f"blk.{i}.attn_qkv.weight", qkv)
            out.t(f"blk.{i}.attn_gate.weight", _permute_heads(sd[la + "in_proj_z.weight"], perm, dv))
            out.t(f"blk.{i}.ssm_alpha.weight", _permute_heads(sd[la + "in_proj_a.weight"], perm, 1))
            out.t(f"blk.{i}.ssm_beta.weight", _permute_heads(sd[la + "in_proj_b.weight"], perm, 1))
            conv = sd[la + "conv1d.weight"].squeeze(1)  # [C, K]
            conv = torch.cat([conv[: 2 * kd], _permute_heads(conv[2 * kd :], perm, dv)], 0)
            out.t(f"blk.{i}.ssm_conv1d.weight", conv)
            out.t(f"blk.{i}.ssm_a", _permute_heads(-torch.exp(sd[la + "A_log"]), perm, 1))
            out.t(f"blk.{i}.ssm_dt.bias", _permute_heads(sd[la + "dt_bias"], perm, 1))
            out.t(f"blk.{i}.ssm_norm.weight", sd[la + "norm.weight"])
            out.t(f"blk.{i}.ssm_out.weight", _permute_heads(sd[la + "out_proj.weight"], perm, dv, axis=1))
        if moe:
            _experts(out, sd, p, i, c.moe_intermediate_size)
            for proj in ["gate", "up", "down"]:
                out.t(f"blk.{i}.ffn_{proj}_shexp.weight", sd[f"{b}mlp.shared_expert.{proj}_proj.weight"])
            out.t(f"blk.{i}.ffn_gate_inp_shexp.weight", sd[f"{b}mlp.shared_expert_gate.weight"].reshape(-1))
        else:
            for proj in ["gate", "up", "down"]:
                out.t(f"blk.{i}.ffn_{proj}.weight", sd[f"{b}mlp.{proj}_proj.weight"])


# ---------------------------------------------------------------------------------------------
# Qwen cases

VOCAB = 256


def _eager(config):
    config._attn_implementation = "eager"
    for sub in ("text_config", "vision_config"):
        if getattr(config, sub, None) is not None:
            getattr(config, sub)._attn_implementation = "eager"
    return config


def _qwen3(moe: bool):
    from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    common = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    )
    if moe:
        c = Qwen3MoeConfig(
            **common,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            tie_word_embeddings=True,
        )
        return Qwen3MoeForCausalLM(_eager(c))
    c = Qwen3Config(**common, tie_word_embeddings=False)
    return Qwen3ForCausalLM(_eager(c))


def _qwen35_text_kwargs(moe: bool) -> dict:
    kw = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        linear_conv_kernel_dim=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
        tie_word_embeddings=False,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000000.0,
            "partial_rotary_factor": 0.25,
            "mrope_section": [2, 1, 1],
            "mrope_interleaved": True,
        },
    )
    if moe:
        kw.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48)
    else:
        kw.update(intermediate_size=96)
    return kw


def _qwen35(moe: bool, multimodal: bool):
    import transformers as tf

    text_kw = _qwen35_text_kwargs(moe)
    if moe:
        TextCfg, Cfg = tf.Qwen3_5MoeTextConfig, tf.Qwen3_5MoeConfig
        TextLm, MmLm = tf.Qwen3_5MoeForCausalLM, tf.Qwen3_5MoeForConditionalGeneration
        VisCfg = tf.Qwen3_5MoeVisionConfig
    else:
        TextCfg, Cfg = tf.Qwen3_5TextConfig, tf.Qwen3_5Config
        TextLm, MmLm = tf.Qwen3_5ForCausalLM, tf.Qwen3_5ForConditionalGeneration
        VisCfg = tf.Qwen3_5VisionConfig
    if not multimodal:
        return TextLm(_eager(TextCfg(**text_kw)))
    vis = VisCfg(
        depth=1,
        hidden_size=32,
        intermediate_size=64,
        num_heads=2,
        patch_size=4,
        spatial_merge_size=2,
        temporal_patch_size=2,
        out_hidden_size=64,
        num_position_embeddings=16,
    )
    cfg = Cfg(text_config=text_kw, vision_config=vis.to_dict(), tie_word_embeddings=False)
    return MmLm(_eager(cfg))


def _qwen35_zero_centred(name: str) -> bool:
    # Qwen3_5RMSNorm is x_hat * (1 + w); the gated GDN norm is plain x_hat * w. The vision
    # tower's LayerNorms are plain too.
    return "norm" in name and "linear_attn.norm" not in name and "visual" not in name


add_case(Case("qwen3", "qwen3", "hf-text", lambda: _qwen3(False), gguf=gguf_qwen3, gguf_arch="qwen3"))
add_case(
    Case(
        "qwen3moe",
        "qwen3moe",
        "hf-text",
        lambda: _qwen3(True),
        gguf=gguf_qwen3,
        gguf_arch="qwen3moe",
        notes="tied embeddings; 4 experts, top-2, norm_topk_prob",
    )
)
add_case(
    Case(
        "qwen35",
        "qwen35",
        "hf-text",
        lambda: _qwen35(False, False),
        zero_centred=_qwen35_zero_centred,
        gguf=gguf_qwen35,
        gguf_arch="qwen35",
        notes="3 GDN layers + 1 gated full-attention layer; 2 key heads shared by 4 value heads",
    )
)
add_case(
    Case(
        "qwen35_mm",
        "qwen35",
        "hf-multimodal",
        lambda: _qwen35(False, True),
        zero_centred=_qwen35_zero_centred,
        notes="multimodal wrapper (tensors under model.language_model.), text-only inputs",
    )
)
add_case(
    Case(
        "qwen35moe",
        "qwen35moe",
        "hf-text",
        lambda: _qwen35(True, False),
        zero_centred=_qwen35_zero_centred,
        gguf=gguf_qwen35,
        gguf_arch="qwen35moe",
        notes="4 experts top-2 + sigmoid-gated shared expert",
    )
)
add_case(
    Case(
        "qwen35moe_mm",
        "qwen35moe",
        "hf-multimodal",
        lambda: _qwen35(True, True),
        zero_centred=_qwen35_zero_centred,
        notes="multimodal wrapper, text-only inputs",
    )
)


# ---------------------------------------------------------------------------------------------
# running a case


def _round(rows: np.ndarray) -> list:
    """float32 values as the shortest decimal that reads back to the same float32."""
    return [[float(np.format_float_positional(np.float32(v), unique=True)) for v in r] for r in rows]


def logits_of(model, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=False)
    return out.logits[0].to(torch.float32).cpu().numpy()


def greedy(model, ids: list[int], steps: int) -> tuple[list[int], list[float]]:
    """Greedy continuation by full re-runs (no cache); returns tokens and each step's top-2 gap."""
    seq = list(ids)
    toks, gaps = [], []
    for _ in range(steps):
        last = logits_of(model, seq)[-1]
        order = np.argsort(-last, kind="stable")
        toks.append(int(order[0]))
        gaps.append(float(last[order[0]] - last[order[1]]))
        seq.append(int(order[0]))
    return toks, gaps


def run_case(case: Case, out_root: Path, seed: int) -> dict:
    import transformers

    torch.manual_seed(seed)
    model = case.build().to(torch.float32).eval()
    randomize(model, seed, case.zero_centred)
    d = out_root / "models" / case.name
    (d / "hf").mkdir(parents=True, exist_ok=True)
    model.save_pretrained(d / "hf", safe_serialization=True)
    files = sorted(p.name for p in (d / "hf").iterdir())
    if case.gguf is not None:
        g = GgufOut(case.gguf_arch or case.arch)
        case.gguf(model, model.config.get_text_config(), g)
        g.write(d / "model.gguf")
        qmodel = copy.deepcopy(model)
        round_trip_q8_0(qmodel)
        gq = GgufOut(case.gguf_arch or case.arch)
        case.gguf(qmodel, qmodel.config.get_text_config(), gq)
        gq.write(d / "model.q8_0.gguf", q8_0=True)
    else:
        qmodel = None
    seqs = []
    for si, ids in enumerate(case.sequences):
        entry = {"tokens": ids, "logits": _round(logits_of(model, ids))}
        if qmodel is not None:
            entry["logits_q8_0"] = _round(logits_of(qmodel, ids))
        if si in GREEDY_FROM:
            toks, gaps = greedy(model, ids, GREEDY_STEPS)
            entry["greedy"] = {"tokens": toks, "top2_gap": gaps}
        seqs.append(entry)
    n_params = sum(p.numel() for p in model.parameters())
    golden = {
        "case": case.name,
        "arch": case.arch,
        "layout": case.layout,
        "hf_class": type(model).__name__,
        "hf_files": files,
        "gguf": "model.gguf" if case.gguf is not None else None,
        # the weights with the matrices in Q8_0, and per sequence `logits_q8_0`: HF's logits for
        # exactly those (Q8_0-rounded) weights
        "gguf_q8_0": "model.q8_0.gguf" if case.gguf is not None else None,
        "notes": case.notes,
        "tolerance": TOLERANCE,
        "metric": METRIC,
        "provenance": {
            "reference": "HF transformers, CPU, float32, eager attention, no KV cache",
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "python": platform.python_version(),
            "dtype": "float32",
            "seed": seed,
            "parameters": n_params,
            "script": "golden/make_golden.py",
            "script_sha256": hashlib.sha256(Path(__file__).read_bytes()).hexdigest(),
        },
        "sequences": seqs,
    }
    (d / "golden.json").write_text(json.dumps(golden, separators=(",", ":")) + "\n")
    return {"case": case.name, "params": n_params, "files": files}


def load_extra_cases() -> None:
    here = Path(__file__).resolve().parent
    extra = here / "gemma_cases.py"
    if extra.exists():
        sys.path.insert(0, str(here))
        import gemma_cases  # noqa: E402

        gemma_cases.register(sys.modules[__name__])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output folder (models/<case>/ is created inside)")
    ap.add_argument("--only", default="", help="comma-separated case names")
    ap.add_argument("--seed", type=int, default=SEED)
    args = ap.parse_args()
    torch.set_num_threads(max(1, min(8, os.cpu_count() or 1)))
    load_extra_cases()
    only = {s for s in args.only.split(",") if s}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    failed = []
    for case in CASES:
        if only and case.name not in only:
            continue
        try:
            info = run_case(case, out, args.seed)
            print(f"ok   {case.name}: {info['params']} parameters, {info['files']}", flush=True)
        except Exception:  # keep going: one broken case must not cost the others
            failed.append(case.name)
            print(f"FAIL {case.name}", flush=True)
            traceback.print_exc()
    print("failed:", failed)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
