#!/usr/bin/env python3
"""Golden cases for the Gemma family, for `golden/make_golden.py` (helper D's framework).

`register(mg)` adds the Gemma cases to make_golden's list; each is a tiny model built with HF
transformers 5.17, every parameter randomised by `mg.randomize` (the Gemma 4 `layer_scalar`
buffers, which it does not touch, are randomised here), saved as `hf/` and, where llama.cpp has
a layout, as `model.gguf` written the way llama.cpp's converter writes it. Cases:

  gemma3        Gemma3ForCausalLM: custom layer_types, query_pre_attn_scalar != head_dim,
                linear RoPE scaling on global layers, final soft-cap, sliding window 4
  gemma3_mm     Gemma3ForConditionalGeneration (tiny SigLIP tower; text-only inputs)
  gemma3_gguf   a Gemma 3 that llama.cpp can express (every 6th layer global, scale from
                head_dim), with its GGUF (norms hold 1 + w)
  gemma4        Gemma4ForCausalLM: 16/32 head dims, K=V global layers with 1 KV head, p-RoPE
                (partial 0.25), final soft-cap, + GGUF
  gemma4_moe    MoE block beside the dense MLP (4 experts, top-2), + GGUF
  gemma4_e4b    per-layer embeddings, 3 KV-shared layers, double-wide MLP there, + GGUF
  gemma4_mm     Gemma4ForConditionalGeneration (text part only)

and, run by this script's own main (make_golden's generic runner cannot drive it), the MTP head:

  gemma4_assistant   Gemma4AssistantForCausalLM over a gemma4 target's KV: golden.json holds,
                     per prompt, the target's last logits and three draft steps (token, position,
                     assistant logits, projected hidden) built as transformers'
                     Gemma4AssistantCandidateGenerator builds them; target in `target/`.

Run where torch, transformers 5.17 and gguf are installed:
    python3 golden/gemma_cases.py --out OUT        (writes OUT/models/gemma*/)
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import traceback
from pathlib import Path

import numpy as np
import torch

VOCAB = 256


# ---------------------------------------------------------------- configs

def _eager(c):
    c._attn_implementation = "eager"
    for sub in ("text_config", "vision_config"):
        if getattr(c, sub, None) is not None:
            getattr(c, sub)._attn_implementation = "eager"
    return c


def gemma3_text_config(**over):
    from transformers import Gemma3TextConfig

    kw = dict(
        vocab_size=VOCAB, hidden_size=48, intermediate_size=64, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=24,
        sliding_window=4, max_position_embeddings=512, rms_norm_eps=1e-6,
        layer_types=["sliding_attention", "full_attention", "sliding_attention",
                     "sliding_attention", "sliding_attention", "full_attention"],
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000000.0},
        },
        final_logit_softcapping=30.0, pad_token_id=0, bos_token_id=2, eos_token_id=1,
        tie_word_embeddings=True,
    )
    kw.update(over)
    return _eager(Gemma3TextConfig(**kw))


def gemma4_text_config(**over):
    from transformers import Gemma4TextConfig

    kw = dict(
        vocab_size=VOCAB, hidden_size=48, intermediate_size=64, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=32,
        num_global_key_value_heads=1, attention_k_eq_v=True, sliding_window=4,
        max_position_embeddings=512, rms_norm_eps=1e-6,
        layer_types=["sliding_attention", "sliding_attention", "full_attention",
                     "sliding_attention", "sliding_attention", "full_attention"],
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                               "rope_theta": 1000000.0},
        },
        final_logit_softcapping=30.0, hidden_size_per_layer_input=0, vocab_size_per_layer_input=VOCAB,
        pad_token_id=0, bos_token_id=2, eos_token_id=1, tie_word_embeddings=True,
    )
    kw.update(over)
    return _eager(Gemma4TextConfig(**kw))


GEMMA4_VARIANTS = {
    "dense": dict(),
    "moe": dict(enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=32,
                attention_k_eq_v=False),
    "e4b": dict(num_hidden_layers=8, attention_k_eq_v=False, hidden_size_per_layer_input=8,
                num_kv_shared_layers=3, use_double_wide_mlp=True,
                layer_types=["sliding_attention", "sliding_attention", "full_attention",
                             "sliding_attention", "sliding_attention", "full_attention",
                             "sliding_attention", "full_attention"]),
}


def _layer_scalars(model, seed):
    """make_golden's randomize leaves buffers alone; Gemma 4's layer_scalar is one."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.copy_(0.5 + torch.rand(b.shape, generator=g))
    return model


def build_gemma3():
    from transformers import Gemma3ForCausalLM

    return Gemma3ForCausalLM(gemma3_text_config())


def build_gemma3_mm():
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration, SiglipVisionConfig

    vis = SiglipVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                             num_attention_heads=2, image_size=28, patch_size=14)
    cfg = Gemma3Config(text_config=gemma3_text_config().to_dict(), vision_config=vis.to_dict(),
                       mm_tokens_per_image=4, boi_token_index=VOCAB - 3, eoi_token_index=VOCAB - 2,
                       image_token_index=VOCAB - 1)
    return Gemma3ForConditionalGeneration(_eager(cfg))


def build_gemma3_for_gguf():
    from transformers import Gemma3ForCausalLM

    # llama.cpp's GGUF has no query_pre_attn_scalar (it scales by head_dim^-0.5), no layer
    # pattern (every 6th layer global) and a fixed local RoPE base: build a model it can express.
    return Gemma3ForCausalLM(gemma3_text_config(query_pre_attn_scalar=16, layer_types=None,
                                                sliding_window_pattern=6))


def build_gemma4(variant, seed):
    def build():
        from transformers import Gemma4ForCausalLM

        return _layer_scalars(Gemma4ForCausalLM(gemma4_text_config(**GEMMA4_VARIANTS[variant])), seed)
    return build


def build_gemma4_mm(seed):
    def build():
        from transformers import Gemma4Config, Gemma4ForConditionalGeneration

        cfg = Gemma4Config(text_config=gemma4_text_config().to_dict())
        return _layer_scalars(Gemma4ForConditionalGeneration(_eager(cfg)), seed)
    return build


# ---------------------------------------------------------------- GGUF writers (llama.cpp layout)

LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
    # Gemma 4
    "layer_scalar": "layer_output_scale.weight",
    "per_layer_input_gate.weight": "inp_gate.weight",
    "per_layer_projection.weight": "proj.weight",
    "post_per_layer_input_norm.weight": "post_norm.weight",
    "router.proj.weight": "ffn_gate_inp.weight",
    "router.scale": "ffn_gate_inp.scale",
    "router.per_expert_scale": "ffn_down_exps.scale",
    "experts.gate_up_proj": "ffn_gate_up_exps.weight",
    "experts.down_proj": "ffn_down_exps.weight",
    "pre_feedforward_layernorm_2.weight": "pre_ffw_norm_2.weight",
    "post_feedforward_layernorm_1.weight": "post_ffw_norm_1.weight",
    "post_feedforward_layernorm_2.weight": "post_ffw_norm_2.weight",
}
GLOBAL = {
    "embed_tokens.weight": "token_embd.weight",
    "norm.weight": "output_norm.weight",
    "embed_tokens_per_layer.weight": "per_layer_token_embd.weight",
    "per_layer_model_projection.weight": "per_layer_model_proj.weight",
    "per_layer_projection_norm.weight": "per_layer_proj_norm.weight",
}


def _tensors(out, model, plus_one):
    for name, t in model.state_dict().items():
        if not name.startswith("model."):
            continue  # lm_head is tied
        rest = name[len("model."):]
        if rest.startswith("layers."):
            _, idx, sub = rest.split(".", 2)
            new = f"blk.{idx}.{LAYER[sub]}"
        else:
            new = GLOBAL[rest]
        a = t.detach().to(torch.float32).cpu().numpy()
        if plus_one and name.endswith("norm.weight"):
            a = a + 1.0  # llama.cpp's Gemma 3 converter stores 1 + w
        out.t(new, a.reshape(1) if a.ndim == 0 else a)


def gguf_gemma3(model, c, out):
    import gguf

    out.meta("add_context_length", c.max_position_embeddings)
    out.meta("add_embedding_length", c.hidden_size)
    out.meta("add_block_count", c.num_hidden_layers)
    out.meta("add_feed_forward_length", c.intermediate_size)
    out.meta("add_head_count", c.num_attention_heads)
    out.meta("add_head_count_kv", c.num_key_value_heads)
    out.meta("add_key_length", c.head_dim)
    out.meta("add_value_length", c.head_dim)
    out.meta("add_layer_norm_rms_eps", c.rms_norm_eps)
    full = c.rope_parameters["full_attention"]
    out.meta("add_rope_freq_base", float(full["rope_theta"]))
    if full.get("rope_type") == "linear":
        out.meta("add_rope_scaling_type", gguf.RopeScalingType.LINEAR)
        out.meta("add_rope_scaling_factor", float(full["factor"]))
    out.meta("add_sliding_window", c.sliding_window)
    if c.final_logit_softcapping:
        out.meta("add_final_logit_softcapping", float(c.final_logit_softcapping))
    _tensors(out, model, True)


def gguf_gemma4(model, c, out):
    swa = [t == "sliding_attention" for t in c.layer_types]
    n = c.num_hidden_layers
    hd_full = c.per_layer_config[swa.index(False)].head_dim
    hd_swa = c.per_layer_config[swa.index(True)].head_dim
    kv = [c.per_layer_config[i].num_key_value_heads for i in range(n)]
    full = c.rope_parameters["full_attention"]
    n_rot = int(hd_full * full["partial_rotary_factor"] / 2)
    ffn = [model.model.layers[i].mlp.gate_proj.weight.shape[0] for i in range(n)]
    out.meta("add_context_length", c.max_position_embeddings)
    out.meta("add_embedding_length", c.hidden_size)
    out.meta("add_block_count", n)
    out.meta("add_feed_forward_length", ffn if len(set(ffn)) > 1 else ffn[0])
    out.meta("add_head_count", c.num_attention_heads)
    out.meta("add_head_count_kv", kv)
    out.meta("add_key_length", hd_full)
    out.meta("add_value_length", hd_full)
    out.meta("add_key_length_swa", hd_swa)
    out.meta("add_value_length_swa", hd_swa)
    out.meta("add_layer_norm_rms_eps", c.rms_norm_eps)
    out.meta("add_rope_freq_base", float(full["rope_theta"]))
    out.meta("add_rope_freq_base_swa", float(c.rope_parameters["sliding_attention"]["rope_theta"]))
    out.meta("add_rope_dimension_count", hd_full)
    out.meta("add_rope_dimension_count_swa", hd_swa)
    out.meta("add_sliding_window", c.sliding_window)
    out.meta("add_sliding_window_pattern", swa)
    out.meta("add_shared_kv_layers", c.num_kv_shared_layers)
    out.meta("add_embedding_length_per_layer_input", c.hidden_size_per_layer_input or 0)
    if c.final_logit_softcapping:
        out.meta("add_final_logit_softcapping", float(c.final_logit_softcapping))
    if c.enable_moe_block:
        out.meta("add_expert_count", c.num_experts)
        out.meta("add_expert_used_count", c.top_k_experts)
        out.meta("add_expert_feed_forward_length", c.moe_intermediate_size)
    # "proportional" RoPE as llama.cpp writes it: divisors 1 for the rotated pairs, 1e30 after.
    out.t("rope_freqs.weight", np.array([1.0] * n_rot + [1e30] * (hd_full // 2 - n_rot), dtype=np.float32))
    _tensors(out, model, False)


# ---------------------------------------------------------------- registration

def _norms_zero_centred(name):
    return True  # Gemma 3 applies every norm as (1 + w)


def register(mg):
    seed = getattr(mg, "SEED", 1234)
    C = mg.Case
    mg.add_case(C("gemma3", "gemma3", "hf-text", build_gemma3, _norms_zero_centred))
    mg.add_case(C("gemma3_mm", "gemma3", "hf-multimodal", build_gemma3_mm, _norms_zero_centred))
    mg.add_case(C("gemma3_gguf", "gemma3", "hf-text", build_gemma3_for_gguf, _norms_zero_centred,
                  gguf=gguf_gemma3))
    mg.add_case(C("gemma4", "gemma4", "hf-text", build_gemma4("dense", seed), gguf=gguf_gemma4))
    mg.add_case(C("gemma4_moe", "gemma4", "hf-text", build_gemma4("moe", seed), gguf=gguf_gemma4))
    mg.add_case(C("gemma4_e4b", "gemma4", "hf-text", build_gemma4("e4b", seed), gguf=gguf_gemma4))
    mg.add_case(C("gemma4_mm", "gemma4", "hf-multimodal", build_gemma4_mm(seed)))


# ---------------------------------------------------------------- MTP assistant

@torch.no_grad()
def assistant_case(mg, out_root: Path, seed: int):
    import transformers
    from transformers import Gemma4AssistantConfig, Gemma4AssistantForCausalLM, Gemma4ForCausalLM

    torch.manual_seed(seed)
    target = _layer_scalars(Gemma4ForCausalLM(gemma4_text_config()), seed).eval()
    mg.randomize(target, seed, lambda n: False)
    acfg = Gemma4AssistantConfig(
        text_config=gemma4_text_config(
            hidden_size=32, intermediate_size=48, num_hidden_layers=2,
            layer_types=["sliding_attention", "full_attention"], hidden_size_per_layer_input=0,
            vocab_size_per_layer_input=0, final_logit_softcapping=None,
        ).to_dict(),
        backbone_hidden_size=48, use_ordered_embeddings=False,
    )
    asst = _layer_scalars(Gemma4AssistantForCausalLM(_eager(acfg)), seed + 1).eval()
    mg.randomize(asst, seed + 1, lambda n: False)
    d = out_root / "models" / "gemma4_assistant"
    target.save_pretrained(d / "target", safe_serialization=True)
    asst.save_pretrained(d / "hf", safe_serialization=True)
    seqs = []
    # prompts longer than the sliding window + 1, so the assistant's window matters
    for ids in [s for s in mg.SEQUENCES if len(s) > 6]:
        x = torch.tensor([ids])
        base = target.model(input_ids=x, use_cache=False, return_shared_kv_states=True)
        kv = base.shared_kv_states
        h = base.last_hidden_state[:, -1:]  # post-final-norm
        tgt = target(input_ids=x, use_cache=False).logits[0, -1]
        tok, pos = int(tgt.argmax()), len(ids)
        steps = []
        for _ in range(3):
            emb = target.model.embed_tokens(torch.tensor([[tok]]))  # scaled by sqrt(hidden)
            o = asst(inputs_embeds=torch.cat([emb, h], dim=-1), position_ids=torch.tensor([[pos]]),
                     shared_kv_states=kv)
            logits = o.logits[0, -1]
            steps.append({"token": tok, "position": pos, "logits": logits.tolist(),
                          "hidden": o.last_hidden_state[0, -1].tolist()})
            tok, h = int(logits.argmax()), o.last_hidden_state  # position stays, as in HF
        seqs.append({"tokens": ids, "target_last_logits": tgt.tolist(), "draft_steps": steps})
    golden = {
        "case": "gemma4_assistant",
        "arch": "gemma4-assistant",
        "kind": "mtp-assistant",
        "layout": "hf-text",
        "hf_class": type(asst).__name__,
        "target": "target",
        "gguf": None,
        "tolerance": mg.TOLERANCE,
        "metric": mg.METRIC,
        "provenance": {
            "reference": "HF transformers, CPU, float32, eager attention; inputs as "
                         "Gemma4AssistantCandidateGenerator builds them",
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "seed": seed,
            "script": "golden/gemma_cases.py",
        },
        "sequences": seqs,
    }
    (d / "golden.json").write_text(json.dumps(golden, separators=(",", ":")) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import make_golden as mg  # noqa: E402

    register(mg)
    out = Path(args.out)
    only = {s for s in args.only.split(",") if s}
    failed = []
    for case in mg.CASES:
        if not case.name.startswith("gemma") or (only and case.name not in only):
            continue
        try:
            info = mg.run_case(case, out, mg.SEED)
            print(f"ok   {case.name}: {info['params']} parameters", flush=True)
        except Exception:
            failed.append(case.name)
            traceback.print_exc()
    if not only or "gemma4_assistant" in only:
        try:
            assistant_case(mg, out, mg.SEED + 7)
            print("ok   gemma4_assistant", flush=True)
        except Exception:
            failed.append("gemma4_assistant")
            traceback.print_exc()
    print("failed:", failed)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
