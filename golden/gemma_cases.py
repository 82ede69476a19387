#!/usr/bin/env python3
"""Golden cases for the Gemma family: tiny random models and HF transformers 5.17 logits.

Each case builds a tiny model with transformers, sets EVERY parameter (norm weights, layer
scalars, router scales included) to seeded random values, saves it as the layout under test
(HF safetensors + config.json, or a GGUF written the way llama.cpp's converter writes it),
and records float32 logits from transformers (CPU, eager attention) for a few token sequences
plus a greedy continuation. Output, per case, under `golden/models/<arch>/<case>/`:

    reference.json   {"arch", "case", "reference", "dtype", "seed", "tolerance", "checkpoint",
                      "sequences": [{"ids", "logits": [[vocab] per position], "greedy"}],
                      and for gemma4-assistant: "target", "draft_steps"}
    model/           config.json + model.safetensors (HF cases)    or   model.gguf

Cases: gemma3 (text, multimodal wrapper, GGUF), gemma4 (dense with K=V and p-RoPE, MoE, E4B-style
PLE + KV sharing + double-wide MLP, text-only wrapper, GGUF of each of the three),
gemma4-assistant (MTP head over a gemma4 target's KV).

`golden/make_golden.py` (helper D) imports `CASES` / `build_case`; run standalone with
    python3 golden/gemma_cases.py [OUT_ROOT=golden/models] [case-name-filter]
Needs torch, transformers==5.17.0, safetensors, numpy and gguf==0.19.0.
"""

import json
import math
import os
import shutil
import sys

import numpy as np
import torch

VOCAB = 256
SEQ_LEN = 10
GREEDY = 6
TOLERANCE = 1e-3


def sequences(seed):
    g = np.random.default_rng(seed)
    return [[2] + [int(x) for x in g.integers(3, VOCAB - 3, SEQ_LEN - 1)] for _ in range(3)]


# ---------------------------------------------------------------- randomisation

def randomise(model, seed, norm_plus_one):
    """Every parameter random. Norm weights: N(0, 0.3) for (1 + w) norms, 1 + N(0, 0.3) for
    plain ones; matrices N(0, 1/sqrt(fan_in)); embeddings N(0, 0.5); scalars in [0.5, 1.5]."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and p.dim() == 1:
                v = torch.randn(p.shape, generator=g) * 0.3
                p.copy_(v if norm_plus_one else 1.0 + v)
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
            elif p.dim() == 1:  # router scale, per-expert scale
                p.copy_(0.5 + torch.rand(p.shape, generator=g))
            else:
                fan_in = p.shape[-1]
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(fan_in))
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.copy_(0.5 + torch.rand(b.shape, generator=g))


# ---------------------------------------------------------------- references

@torch.no_grad()
def reference(model, seqs):
    out = []
    for ids in seqs:
        x = torch.tensor([ids])
        logits = model(input_ids=x, use_cache=False).logits[0].float()
        seq, greedy = list(ids), []
        for _ in range(GREEDY):
            nxt = int(model(input_ids=torch.tensor([seq]), use_cache=False).logits[0, -1].argmax())
            greedy.append(nxt)
            seq.append(nxt)
        out.append({"ids": ids, "logits": logits.tolist(), "greedy": greedy})
    return out


def write_case(root, arch, case, seed, checkpoint, seqs_out, extra=None):
    d = os.path.join(root, arch, case)
    doc = {
        "arch": arch,
        "case": case,
        "reference": "transformers 5.17.0, float32, CPU, eager attention",
        "dtype": "float32",
        "seed": seed,
        "tolerance": TOLERANCE,
        "checkpoint": checkpoint,
        "sequences": seqs_out,
    }
    doc.update(extra or {})
    with open(os.path.join(d, "reference.json"), "w") as f:
        json.dump(doc, f, separators=(",", ":"))


def fresh_dir(root, arch, case):
    d = os.path.join(root, arch, case)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    return d


def save_hf(model, d):
    model.save_pretrained(os.path.join(d, "model"), safe_serialization=True)
    for extra in ("generation_config.json",):
        p = os.path.join(d, "model", extra)
        if os.path.exists(p):
            os.remove(p)


# ---------------------------------------------------------------- GGUF writers (llama.cpp layout)

G3_LAYER = {
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
}
G4_LAYER = dict(G3_LAYER)
G4_LAYER.update({
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
})
GLOBAL = {
    "embed_tokens.weight": "token_embd.weight",
    "norm.weight": "output_norm.weight",
    "embed_tokens_per_layer.weight": "per_layer_token_embd.weight",
    "per_layer_model_projection.weight": "per_layer_model_proj.weight",
    "per_layer_projection_norm.weight": "per_layer_proj_norm.weight",
}


def gguf_tensors(sd, prefix, layer_map, plus_one):
    out = {}
    for name, t in sd.items():
        if not name.startswith(prefix):
            continue
        rest = name[len(prefix):]
        a = t.detach().float().numpy().astype(np.float32)
        if rest.startswith("layers."):
            _, idx, sub = rest.split(".", 2)
            if sub not in layer_map:
                raise SystemExit(f"no GGUF name for {name}")
            new = f"blk.{idx}.{layer_map[sub]}"
        elif rest in GLOBAL:
            new = GLOBAL[rest]
        else:
            raise SystemExit(f"no GGUF name for {name}")
        if plus_one and name.endswith("norm.weight"):
            a = a + 1.0  # llama.cpp's Gemma3 converter folds the 1 + w
        if a.ndim == 0:
            a = a.reshape(1)
        out[new] = np.ascontiguousarray(a)
    return out


def write_gguf(path, arch, tensors, setup):
    import gguf

    w = gguf.GGUFWriter(path, arch)
    setup(w)
    for name in sorted(tensors):
        w.add_tensor(name, tensors[name])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def gemma3_gguf(model, cfg, path):
    import gguf

    def setup(w):
        w.add_context_length(cfg.max_position_embeddings)
        w.add_embedding_length(cfg.hidden_size)
        w.add_block_count(cfg.num_hidden_layers)
        w.add_feed_forward_length(cfg.intermediate_size)
        w.add_head_count(cfg.num_attention_heads)
        w.add_head_count_kv(cfg.num_key_value_heads)
        w.add_key_length(cfg.head_dim)
        w.add_value_length(cfg.head_dim)
        w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
        full = cfg.rope_parameters["full_attention"]
        w.add_rope_freq_base(full["rope_theta"])
        if full.get("rope_type") == "linear":
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(full["factor"])
        w.add_sliding_window(cfg.sliding_window)
        if cfg.final_logit_softcapping:
            w.add_final_logit_softcapping(cfg.final_logit_softcapping)

    write_gguf(path, "gemma3", gguf_tensors(model.state_dict(), "model.", G3_LAYER, True), setup)


def gemma4_gguf(model, cfg, path):
    tensors = gguf_tensors(model.state_dict(), "model.", G4_LAYER, False)
    swa = [t == "sliding_attention" for t in cfg.layer_types]
    hd_full = cfg.per_layer_config[swa.index(False)].head_dim
    hd_swa = cfg.per_layer_config[swa.index(True)].head_dim
    kv = [cfg.per_layer_config[i].num_key_value_heads for i in range(cfg.num_hidden_layers)]
    full = cfg.rope_parameters["full_attention"]
    n_rot = int(hd_full * full["partial_rotary_factor"] / 2)
    tensors["rope_freqs.weight"] = np.array([1.0] * n_rot + [1e30] * (hd_full // 2 - n_rot), dtype=np.float32)
    ffn = [model.model.layers[i].mlp.gate_proj.weight.shape[0] for i in range(cfg.num_hidden_layers)]

    def setup(w):
        w.add_context_length(cfg.max_position_embeddings)
        w.add_embedding_length(cfg.hidden_size)
        w.add_block_count(cfg.num_hidden_layers)
        w.add_feed_forward_length(ffn if len(set(ffn)) > 1 else ffn[0])
        w.add_head_count(cfg.num_attention_heads)
        w.add_head_count_kv(kv)
        w.add_key_length(hd_full)
        w.add_value_length(hd_full)
        w.add_key_length_swa(hd_swa)
        w.add_value_length_swa(hd_swa)
        w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
        w.add_rope_freq_base(full["rope_theta"])
        w.add_rope_freq_base_swa(cfg.rope_parameters["sliding_attention"]["rope_theta"])
        w.add_rope_dimension_count(hd_full)
        w.add_rope_dimension_count_swa(hd_swa)
        w.add_sliding_window(cfg.sliding_window)
        w.add_sliding_window_pattern(swa)
        w.add_shared_kv_layers(cfg.num_kv_shared_layers)
        w.add_embedding_length_per_layer_input(cfg.hidden_size_per_layer_input or 0)
        if cfg.final_logit_softcapping:
            w.add_final_logit_softcapping(cfg.final_logit_softcapping)
        if cfg.enable_moe_block:
            w.add_expert_count(cfg.num_experts)
            w.add_expert_used_count(cfg.top_k_experts)
            w.add_expert_feed_forward_length(cfg.moe_intermediate_size)

    write_gguf(path, "gemma4", tensors, setup)


# ---------------------------------------------------------------- configs

def gemma3_text_config(**over):
    from transformers import Gemma3TextConfig

    kw = dict(
        vocab_size=VOCAB, hidden_size=48, intermediate_size=64, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=24,
        sliding_window=4, max_position_embeddings=256, rms_norm_eps=1e-6,
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
    c = Gemma3TextConfig(**kw)
    c._attn_implementation = "eager"
    return c


def gemma4_text_config(**over):
    from transformers import Gemma4TextConfig

    kw = dict(
        vocab_size=VOCAB, hidden_size=48, intermediate_size=64, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=32,
        num_global_key_value_heads=1, attention_k_eq_v=True, sliding_window=4,
        max_position_embeddings=256, rms_norm_eps=1e-6,
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
    c = Gemma4TextConfig(**kw)
    c._attn_implementation = "eager"
    return c


def eager(model):
    model.config._attn_implementation = "eager"
    for sub in ("text_config",):
        if hasattr(model.config, sub) and getattr(model.config, sub) is not None:
            getattr(model.config, sub)._attn_implementation = "eager"
    return model.eval()


# ---------------------------------------------------------------- cases

def case_gemma3_text(root, seed):
    from transformers import Gemma3ForCausalLM

    m = eager(Gemma3ForCausalLM(gemma3_text_config()))
    randomise(m, seed, True)
    d = fresh_dir(root, "gemma3", "hf_text")
    save_hf(m, d)
    write_case(root, "gemma3", "hf_text", seed, "model", reference(m, sequences(seed)))


def case_gemma3_multimodal(root, seed):
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration, SiglipVisionConfig

    vis = SiglipVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                             num_attention_heads=2, image_size=28, patch_size=14)
    cfg = Gemma3Config(text_config=gemma3_text_config().to_dict(), vision_config=vis.to_dict(),
                       mm_tokens_per_image=4, boi_token_index=VOCAB - 3, eoi_token_index=VOCAB - 2,
                       image_token_index=VOCAB - 1)
    m = eager(Gemma3ForConditionalGeneration(cfg))
    randomise(m, seed, True)
    d = fresh_dir(root, "gemma3", "hf_multimodal")
    save_hf(m, d)
    write_case(root, "gemma3", "hf_multimodal", seed, "model", reference(m, sequences(seed)))


def case_gemma3_gguf(root, seed):
    from transformers import Gemma3ForCausalLM

    # llama.cpp's GGUF has no query_pre_attn_scalar (it uses head_dim) and no layer pattern
    # (every 6th layer global) and a fixed local RoPE base: the HF model is built to match.
    cfg = gemma3_text_config(query_pre_attn_scalar=16, layer_types=None, sliding_window_pattern=6)
    m = eager(Gemma3ForCausalLM(cfg))
    randomise(m, seed, True)
    d = fresh_dir(root, "gemma3", "gguf")
    gemma3_gguf(m, m.config, os.path.join(d, "model.gguf"))
    write_case(root, "gemma3", "gguf", seed, "model.gguf", reference(m, sequences(seed)))


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


def case_gemma4(variant, gguf_too):
    def run(root, seed):
        from transformers import Gemma4ForCausalLM

        m = eager(Gemma4ForCausalLM(gemma4_text_config(**GEMMA4_VARIANTS[variant])))
        randomise(m, seed, False)
        refs = reference(m, sequences(seed))
        d = fresh_dir(root, "gemma4", f"hf_{variant}")
        save_hf(m, d)
        write_case(root, "gemma4", f"hf_{variant}", seed, "model", refs)
        if gguf_too:
            d = fresh_dir(root, "gemma4", f"gguf_{variant}")
            gemma4_gguf(m, m.config, os.path.join(d, "model.gguf"))
            write_case(root, "gemma4", f"gguf_{variant}", seed, "model.gguf", refs)
    return run


def case_gemma4_wrapper(root, seed):
    from transformers import Gemma4Config, Gemma4ForConditionalGeneration

    cfg = Gemma4Config(text_config=gemma4_text_config().to_dict())
    m = eager(Gemma4ForConditionalGeneration(cfg))
    randomise(m, seed, False)
    d = fresh_dir(root, "gemma4", "hf_multimodal")
    save_hf(m, d)
    write_case(root, "gemma4", "hf_multimodal", seed, "model", reference(m, sequences(seed)))


@torch.no_grad()
def case_gemma4_assistant(root, seed):
    from transformers import Gemma4AssistantConfig, Gemma4AssistantForCausalLM, Gemma4ForCausalLM

    target = eager(Gemma4ForCausalLM(gemma4_text_config()))
    randomise(target, seed, False)
    acfg = Gemma4AssistantConfig(
        text_config=gemma4_text_config(
            hidden_size=32, intermediate_size=48, num_hidden_layers=2,
            layer_types=["sliding_attention", "full_attention"], hidden_size_per_layer_input=0,
            vocab_size_per_layer_input=0, final_logit_softcapping=None,
        ).to_dict(),
        backbone_hidden_size=48, use_ordered_embeddings=False,
    )
    asst = eager(Gemma4AssistantForCausalLM(acfg))
    asst.model.config._attn_implementation = "eager"
    randomise(asst, seed + 1, False)
    d = fresh_dir(root, "gemma4-assistant", "hf")
    save_hf(target, os.path.join(d, "target"))
    os.rename(os.path.join(d, "target", "model"), os.path.join(d, "target_model"))
    os.rmdir(os.path.join(d, "target"))
    save_hf(asst, d)
    seqs = sequences(seed)
    out = []
    for ids in seqs:
        x = torch.tensor([ids])
        base = target.model(input_ids=x, use_cache=False, return_shared_kv_states=True)
        kv = base.shared_kv_states
        h = base.last_hidden_state[:, -1:]
        tgt_logits = target(input_ids=x, use_cache=False).logits[0, -1]
        tok = int(tgt_logits.argmax())
        pos = len(ids)
        steps = []
        for _ in range(3):
            emb = target.model.embed_tokens(torch.tensor([[tok]]))
            o = asst(inputs_embeds=torch.cat([emb, h], dim=-1), position_ids=torch.tensor([[pos]]),
                     shared_kv_states=kv)
            logits = o.logits[0, -1]
            steps.append({"token": tok, "position": pos, "logits": logits.tolist(),
                          "hidden": o.last_hidden_state[0, -1].tolist()})
            tok, h = int(logits.argmax()), o.last_hidden_state
        out.append({"ids": ids, "target_last_logits": tgt_logits.tolist(), "draft_steps": steps})
    doc = {"arch": "gemma4-assistant", "case": "hf", "seed": seed, "tolerance": TOLERANCE,
           "reference": "transformers 5.17.0 Gemma4AssistantForCausalLM, float32, CPU, eager; "
                        "target Gemma4ForCausalLM; inputs as Gemma4AssistantCandidateGenerator builds them",
           "dtype": "float32", "checkpoint": "model", "target": "target_model", "sequences": out}
    with open(os.path.join(d, "reference.json"), "w") as f:
        json.dump(doc, f, separators=(",", ":"))


CASES = [
    ("gemma3/hf_text", case_gemma3_text, 301),
    ("gemma3/hf_multimodal", case_gemma3_multimodal, 302),
    ("gemma3/gguf", case_gemma3_gguf, 303),
    ("gemma4/dense", case_gemma4("dense", True), 401),
    ("gemma4/moe", case_gemma4("moe", True), 402),
    ("gemma4/e4b", case_gemma4("e4b", True), 403),
    ("gemma4/hf_multimodal", case_gemma4_wrapper, 404),
    ("gemma4-assistant/hf", case_gemma4_assistant, 501),
]


def build_case(name, root):
    for n, fn, seed in CASES:
        if n == name:
            torch.manual_seed(seed)
            fn(root, seed)
            return
    raise KeyError(name)


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "models")
    filt = sys.argv[2] if len(sys.argv) > 2 else ""
    torch.set_grad_enabled(False)
    failed = []
    for name, _, _ in CASES:
        if filt not in name:
            continue
        try:
            build_case(name, root)
            print("ok", name, flush=True)
        except Exception as e:  # keep going: report every failing case at the end
            import traceback
            traceback.print_exc()
            failed.append(f"{name}: {e!r}")
    if failed:
        print("FAILED:\n" + "\n".join(failed))
        sys.exit(1)


if __name__ == "__main__":
    main()
