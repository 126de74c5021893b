#!/usr/bin/env python3
"""Reference fixtures for model variants the shared oracles do not cover.

Each variant is a tiny random Hugging Face model (transformers 5.24.0, CPU, float32), built from
a config, with every parameter overwritten from a fixed seed (spec architectures.md §1.4: norm
weights 1 + 0.2·N(0,1), everything else 0.15·N(0,1)), saved with save_pretrained, then RELOADED
from disk so the reference numbers come from exactly the bytes the engine will read. The reload
runs in float32 with eager attention.

Output, per variant (the layout of the shared oracle fixtures):

  <out>/<name>/model/{config.json, generation_config.json, model.safetensors}
  <out>/<name>/input_ids.json     {"prompt_ids": [...], "greedy_new_ids": [...]}
  <out>/<name>/logits.f32         raw little-endian f32, [T, vocab], every prompt position
  <out>/<name>/hidden_states.npy  f32 [layers + 1, T, hidden]: embeddings, each layer's output,
                                  with the final norm applied to the last entry (HF's convention)
  <out>/<name>/decode_logits.f32  (Kimi-Linear decode variant only) raw f32 [T - d + 1, vocab]: the
                                  logits of positions d-1 .. T-1 from transformers' *cached* decode
                                  (a d-token prefill with use_cache, then one token at a time)
  <out>/<name>/meta.json          versions, config, tensor names/shapes/dtypes, file sha256,
                                  per layer the FFN kind and attention window of the HF modules,
                                  the smallest router top-k gap; for a variant with a `contrast`,
                                  how far its logits are from the same bytes with the feature
                                  switched off (and, for OLMoE's clip_qkv, how much the clamp bites)

Environment (outside the repository), either
  mkdir -p /tmp/oracle-env && cd /tmp/oracle-env && bash <shared>/oracles/scripts/install.sh   # ./venv
or
  python3 -m venv /tmp/oracle-venv
  /tmp/oracle-venv/bin/pip install torch "transformers==5.24.0" safetensors numpy
Usage:
  <venv>/bin/python tools/oracles/make_extra_oracles.py --out tests/fixtures/oracles [--only NAME ...]

Reproducibility: the weights (model.safetensors, config.json) come out byte-identical on any
machine, except the ones a variant keeps at the library initialisation (kimi_linear_decode_f32's
dt_bias, an inverse softplus computed with the CPU's exp/log: 2e-7..5e-7 apart between two x86
machines); the reference logits can move in the last bits with the CPU's kernels (up to 1e-6
relative seen between two x86 machines, 3.3e-6 for kimi_linear_decode_f32), far inside the engine
tests' 2e-5.
"""
import json
import os
import sys
import time

import numpy as np
import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # oracle_common.py, from any working directory
from oracle_common import (cached_decode, digests_meta, forward_watching_routers, overwrite_from_seed,  # noqa: E402
                           prompt_ids, reference_run, rel_diff, reload, reload_with, run_variants, sha256_of,
                           tiny_model, write_f32, write_meta, write_reference, zero_bias_logits)

SEED = 20240605
VOCAB = 512
NEW_TOKENS = 8

# Shared shape: hidden 64, 4 layers, 4 query heads over 2 KV heads (GQA), head_dim 16.
TINY = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
            bos_token_id=1, eos_token_id=2, pad_token_id=0)

# Llama 3.x frequency scaling with a tiny original context (16) so that a short prompt already
# spans all three bands of spec §0.5: unscaled, smoothed and divided by `factor`.
LLAMA3_ROPE = dict(rope_type="llama3", rope_theta=5e5, factor=8.0, low_freq_factor=1.0,
                   high_freq_factor=4.0, original_max_position_embeddings=16)

VARIANTS = {
    # Llama 3 scaling, tied embeddings (no lm_head.weight in the file), GQA 4:2.
    "llama3_f32": dict(prompt_len=24, config=dict(
        TINY, model_type="llama", rms_norm_eps=1e-5, tie_word_embeddings=True,
        rope_parameters=dict(LLAMA3_ROPE))),
    # Qwen2: q/k/v biases (hard-coded by the class), tied, rope_theta 1e6.
    "qwen2_f32": dict(prompt_len=24, config=dict(
        TINY, model_type="qwen2", rms_norm_eps=1e-6, tie_word_embeddings=True,
        rope_parameters=dict(rope_type="default", rope_theta=1e6), use_sliding_window=False)),
    # Qwen2-MoE: 4 experts top-2, shared expert with its sigmoid gate, layer 1 dense,
    # norm_topk_prob left at the class default (false), q/k/v bias.
    "qwen2_moe_f32": dict(prompt_len=24, config=dict(
        TINY, model_type="qwen2_moe", rms_norm_eps=1e-6, tie_word_embeddings=False,
        rope_parameters=dict(rope_type="default", rope_theta=1e6), num_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48,
        decoder_sparse_step=1, mlp_only_layers=[1], qkv_bias=True, use_sliding_window=False)),
    # The llama3_f32 model (same config and seed, so byte-identical weights) on a 300-token
    # prompt: RoPE angles at positions where the f32 rounding of t·inv_freq shows (spec §0.5).
    "llama_longctx_f32": dict(prompt_len=300, config=dict(
        TINY, model_type="llama", rms_norm_eps=1e-5, tie_word_embeddings=True,
        rope_parameters=dict(LLAMA3_ROPE))),
    # OLMoE with clip_qkv = 0.5 (spec §2.4, §2.5): q and k are RMS-normalised over the whole
    # projection (weights 1 + 0.2·N), so most of their entries exceed 0.5, and so do most of v's
    # (0.15·N weights over 64 inputs); the clamp changes the logits by far more than the
    # tolerance (the `contrast` below, recorded in meta.json). GQA 4:2, so k_norm spans kv_dim.
    # 8 experts top-2, no renormalisation (the release's norm_topk_prob false), untied.
    "olmoe_clip_f32": dict(prompt_len=24, contrast=dict(clip_qkv=None), config=dict(
        TINY, model_type="olmoe", intermediate_size=32, rms_norm_eps=1e-5, tie_word_embeddings=False,
        rope_parameters=dict(rope_type="default", rope_theta=1e4), num_experts=8,
        num_experts_per_tok=2, norm_topk_prob=False, clip_qkv=0.5)),
    # Qwen3-MoE, 6 layers, decoder_sparse_step 2 (layers 1, 3, 5 would be MoE) minus
    # mlp_only_layers [3]: dense, MoE, dense, dense, dense, MoE. 8 experts top-2 renormalised,
    # head_dim 32 ≠ hidden / heads (q is 128 wide), per-head q/k norm, untied.
    # The contrast turns the renormalisation off on the same weights.
    "qwen3_moe_sparse_f32": dict(prompt_len=24, contrast=dict(norm_topk_prob=False), config=dict(
        TINY, model_type="qwen3_moe", num_hidden_layers=6, head_dim=32, rms_norm_eps=1e-6,
        tie_word_embeddings=False, rope_parameters=dict(rope_type="default", rope_theta=1e6),
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True,
        decoder_sparse_step=2, mlp_only_layers=[3], use_sliding_window=False)),
    # Qwen2-MoE with decoder_sparse_step 2 and no mlp_only_layers: dense, MoE, dense, MoE.
    # 8 experts top-3 without renormalisation, shared expert (48 wide) with its sigmoid gate,
    # q/k/v bias, untied.
    # The contrast turns the renormalisation on.
    "qwen2_moe_sparse_f32": dict(prompt_len=24, contrast=dict(norm_topk_prob=True), config=dict(
        TINY, model_type="qwen2_moe", rms_norm_eps=1e-6, tie_word_embeddings=False,
        rope_parameters=dict(rope_type="default", rope_theta=1e6), num_experts=8,
        num_experts_per_tok=3, moe_intermediate_size=32, shared_expert_intermediate_size=48,
        norm_topk_prob=False, decoder_sparse_step=2, mlp_only_layers=[], qkv_bias=True,
        use_sliding_window=False)),
    # Mixtral with sliding_window 8 on a 32-token prompt: every layer's attention sees the last
    # 8 keys only (spec §0.6, t − W < s ≤ t; transformers 5.24.0 builds that mask for the
    # eager path whenever `sliding_window` is set). 4 experts top-2, untied. The contrast is the
    # same weights with the window off: identical logits before position 8, different after.
    "mixtral_swa_f32": dict(prompt_len=32, contrast=dict(sliding_window=None), window=8, config=dict(
        TINY, model_type="mixtral", rms_norm_eps=1e-5, tie_word_embeddings=False,
        rope_parameters=dict(rope_type="default", rope_theta=1e6), num_local_experts=4,
        num_experts_per_tok=2, sliding_window=8)),
    # Qwen2 with use_sliding_window and max_window_layers 2: layers 0-1 full attention, layers
    # 2-3 a window of 8 (Qwen2Config: sliding from max_window_layers on; saved as layer_types).
    # 32-token prompt, tied, q/k/v bias.
    "qwen2_swa_f32": dict(prompt_len=32, window=8, contrast=dict(
        use_sliding_window=False, sliding_window=None, layer_types=["full_attention"] * 4), config=dict(
        TINY, model_type="qwen2", rms_norm_eps=1e-6, tie_word_embeddings=True,
        rope_parameters=dict(rope_type="default", rope_theta=1e6), use_sliding_window=True,
        sliding_window=8, max_window_layers=2)),
    # Qwen3-MoE with use_sliding_window: unlike Qwen2/Qwen3 (layer_types from max_window_layers
    # on), transformers 5.24.0 gives Qwen3-MoE no layer_types and applies `sliding_window` to
    # every layer (Qwen3MoeModel picks the sliding mask whenever config.sliding_window is set).
    # max_window_layers 2 is written into the config, as released Qwen3-MoE configs carry the
    # field, and is ignored by the class. 4 experts top-2 renormalised, head_dim 32, untied.
    "qwen3_moe_swa_f32": dict(prompt_len=32, window=8, contrast=dict(use_sliding_window=False, sliding_window=None),
        config=dict(TINY, model_type="qwen3_moe", head_dim=32, rms_norm_eps=1e-6, tie_word_embeddings=False,
            rope_parameters=dict(rope_type="default", rope_theta=1e6), num_experts=4, num_experts_per_tok=2,
            moe_intermediate_size=32, norm_topk_prob=True, use_sliding_window=True, sliding_window=8,
            max_window_layers=2)),
    # Qwen2-MoE with use_sliding_window, from a transformers-4-style config.json: `layer_types`
    # is removed from the saved file, so the reload derives it the way transformers 5.24.0 does
    # for Hub configs (Qwen2MoeConfig.__post_init__): windowed iff the layer index is even and
    # below max_window_layers (3 here), i.e. layers 0 and 2 of 4, the opposite side of
    # max_window_layers from Qwen2's rule. Window 8, 32 tokens, 4 experts top-2, shared expert.
    "qwen2_moe_swa_f32": dict(prompt_len=32, window=8, strip_saved_config=["layer_types"],
        # Window off as Qwen2MoeConfig itself writes it (sliding_window 0; the model builds the
        # sliding mask regardless, and no layer uses it).
        contrast=dict(use_sliding_window=False, sliding_window=0, layer_types=["full_attention"] * 4),
        config=dict(TINY, model_type="qwen2_moe", rms_norm_eps=1e-6, tie_word_embeddings=False,
            rope_parameters=dict(rope_type="default", rope_theta=1e6), num_experts=4, num_experts_per_tok=2,
            moe_intermediate_size=32, shared_expert_intermediate_size=48, decoder_sparse_step=1,
            mlp_only_layers=[], use_sliding_window=True, sliding_window=8, max_window_layers=3)),
}

# DeepSeek-V2/V3 and Kimi-Linear (spec architectures.md §3.10, §4.6). Every matrix's column count
# is a multiple of 32 (kv_lora_rank, q_lora_rank, heads x v_head_dim, the KDA head_dim), so the same
# checkpoints also go through `waste quantize` and q4/q8 containers. v_head_dim differs from
# qk_nope_head_dim where the recipe asks for it. The router's e_score_correction_bias is a buffer,
# not a parameter: `randomise` leaves it at zero, so these variants set it to 0.3*N(0,1) (spec
# §3.10) and record a `bias_contrast` (the same weights with the bias zeroed) showing that it changes
# which experts win. Kimi keeps the library initialisation of A_log (ln U[1,16]) and dt_bias
# (inverse softplus of U[1e-3, 1e-1]) so that the decays are realistic (spec §4.6).
MLA_TINY = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32, qk_rope_head_dim=8,
                qk_nope_head_dim=16, max_position_embeddings=320, bos_token_id=1, eos_token_id=2,
                pad_token_id=0, tie_word_embeddings=False)
LATENT_RANDOM = dict(bias_sd=0.3, keep=())

VARIANTS.update({
    # DeepSeek-V3 as §3.10 gives it: q-LoRA, YaRN (factor 40 over an original context of 8, so a
    # 24-token prompt is deep in the interpolated band) with mscale = mscale_all_dim = 1 (softmax
    # scale x (1 + 0.1 ln 40)^2), interleaved RoPE, 8 experts in 4 groups of which the best 2 are
    # kept, top-3, renormalised, x2.5, one shared expert, layer 0 dense. The contrast drops the group
    # limit (n_group = topk_group = 1) on the same weights.
    "deepseek_v3_group_f32": dict(prompt_len=24, randomise=LATENT_RANDOM, bias_contrast=True,
        contrast=dict(n_group=1, topk_group=1), config=dict(
            MLA_TINY, model_type="deepseek_v3", num_hidden_layers=3, q_lora_rank=32, v_head_dim=24,
            n_routed_experts=8, num_experts_per_tok=3, n_group=4, topk_group=2, n_shared_experts=1,
            first_k_dense_replace=1, routed_scaling_factor=2.5, norm_topk_prob=True, rope_interleave=True,
            rms_norm_eps=1e-6, num_mtp_layers=0,
            rope_parameters=dict(rope_type="yarn", rope_theta=1e4, factor=40.0, mscale=1.0, mscale_all_dim=1.0,
                                 beta_fast=32.0, beta_slow=1.0, original_max_position_embeddings=8))),
    # The other V3 branches (§3.10): a direct q_proj (q_lora_rank None), half-split RoPE
    # (rope_interleave false), raw top-k weights (norm_topk_prob false) still x2.5, one group,
    # default RoPE, two dense layers before the MoE ones. The contrast interleaves the RoPE.
    "deepseek_v3_plain_f32": dict(prompt_len=24, randomise=LATENT_RANDOM, bias_contrast=True,
        contrast=dict(rope_interleave=True), config=dict(
            MLA_TINY, model_type="deepseek_v3", num_hidden_layers=4, q_lora_rank=None, v_head_dim=16,
            n_routed_experts=8, num_experts_per_tok=2, n_group=1, topk_group=1, n_shared_experts=1,
            first_k_dense_replace=2, routed_scaling_factor=2.5, norm_topk_prob=False, rope_interleave=False,
            rms_norm_eps=1e-6, num_mtp_layers=0, rope_parameters=dict(rope_type="default", rope_theta=1e4))),
    # DeepSeek-V2-Lite's routing (§3.7): softmax, greedy top-2, no renormalisation, x1.0, two shared
    # experts; direct q_proj; YaRN with mscale = mscale_all_dim = 0.707 (cos/sin factor 1, softmax
    # scale x (1 + 0.0707 ln 40)^2). V2 rotates interleaved pairs as complex numbers. The contrast
    # drops mscale_all_dim: the softmax scale loses its factor and cos/sin gain get_mscale(40).
    "deepseek_v2_lite_f32": dict(prompt_len=24, config=dict(
            MLA_TINY, model_type="deepseek_v2", num_hidden_layers=3, q_lora_rank=None, v_head_dim=16,
            n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=2, topk_method="greedy",
            first_k_dense_replace=1, routed_scaling_factor=1.0, norm_topk_prob=False, rms_norm_eps=1e-6,
            rope_parameters=dict(rope_type="yarn", rope_theta=1e4, factor=40.0, mscale=0.707,
                                 mscale_all_dim=0.707, original_max_position_embeddings=8)),
        contrast=dict(rope_parameters=dict(rope_type="yarn", rope_theta=1e4, factor=40.0, mscale=0.707,
                                           original_max_position_embeddings=8))),
    # DeepSeek-V2 group_limited_greedy (§3.7): softmax, the best 2 of 4 groups by their max
    # probability, the others' probabilities set to 0, top-3 of the rest, x16, no renormalisation;
    # q-LoRA, v_head_dim 24, default RoPE. The contrast is plain greedy.
    "deepseek_v2_glg_f32": dict(prompt_len=24, contrast=dict(topk_method="greedy"), config=dict(
            MLA_TINY, model_type="deepseek_v2", num_hidden_layers=3, q_lora_rank=32, v_head_dim=24,
            n_routed_experts=8, num_experts_per_tok=3, n_shared_experts=1, n_group=4, topk_group=2,
            topk_method="group_limited_greedy", first_k_dense_replace=1, routed_scaling_factor=16.0,
            norm_topk_prob=False, rms_norm_eps=1e-6, rope_parameters=dict(rope_type="default", rope_theta=1e4))),
    # Kimi-Linear (§4.6) with five layers: kda_layers [1, 2, 3, 5] and full_attn_layers [4] are
    # 1-based, so the NoPE MLA layer is 0-based 3 and layer 4 is KDA again (a 0-based reading would
    # swap them). KDA head_dim 32, 4 heads, conv kernel 4; sigmoid routing with the bias, top-2 of 4
    # renormalised, x2.446, one shared expert; layer 0 dense (saved by transformers under
    # `block_sparse_moe.`, spec §4.2). A 72-token prompt: transformers' chunked prefill (chunks of
    # 64) carries its state across a chunk boundary. decode_logits.f32 holds transformers' cached
    # decode from a 12-token prefill on (spec §4.6).
    "kimi_linear_decode_f32": dict(prompt_len=72, decode_from=12, bias_contrast=True,
        randomise=dict(bias_sd=0.3, keep=("A_log", "dt_bias")), config=dict(
            MLA_TINY, model_type="kimi_linear", num_hidden_layers=5, q_lora_rank=None, v_head_dim=16,
            num_experts=4, num_experts_per_token=2, num_shared_experts=1, num_expert_group=1, topk_group=1,
            moe_renormalize=True, routed_scaling_factor=2.446, first_k_dense_replace=1, rms_norm_eps=1e-5,
            mla_use_nope=True, linear_attn_config=dict(head_dim=32, num_heads=4, short_conv_kernel_size=4,
                                                       kda_layers=[1, 2, 3, 5], full_attn_layers=[4]))),
})

# A contrast (the same bytes reloaded with the config fields that a fixture is about switched
# off) must move the logits by at least this, relative to max|logit|: 50 times the engine
# tests' tolerance (2e-5), so an engine that ignored the feature could not pass.
MIN_CONTRAST = 1e-3


def randomise(model, seed, keep=(), bias_sd=None):
    """Overwrites every floating parameter from one generator, in named_parameters order; the
    parameters whose name contains one of `keep` keep their library initialisation. With
    `bias_sd`, the routers' e_score_correction_bias buffers are then drawn as bias_sd*N(0,1)."""
    def weight(name, _p, noise):
        if any(k in name for k in keep):
            return None
        return 1.0 + 0.2 * noise if "norm" in name else 0.15 * noise

    g = overwrite_from_seed(model, seed, weight, buffers=False)
    if bias_sd is not None:
        with torch.no_grad():
            for name, b in model.named_buffers():
                if name.endswith("e_score_correction_bias"):
                    b.copy_(bias_sd * torch.randn(b.shape, generator=g, dtype=torch.float32))


def structure_of(model):
    """Per layer, read from the instantiated HF modules (not from the config logic): the FFN
    kind and the attention window the layer's mask uses."""
    cfg = model.config
    types = getattr(cfg, "layer_types", None)
    out = []
    for i, layer in enumerate(model.model.layers):
        ffn = "moe" if hasattr(layer.mlp, "experts") else "dense"
        if types is not None:
            window = cfg.sliding_window if types[i] == "sliding_attention" else None
        else:
            window = getattr(cfg, "sliding_window", None)
        entry = dict(ffn=ffn, sliding_window=window)
        mixer = type(layer.self_attn).__name__
        if "DeltaAttention" in mixer:
            entry["mixer"] = "kda"
        elif hasattr(layer.self_attn, "kv_a_proj_with_mqa"):
            entry["mixer"] = "mla"
        out.append(entry)
    return out


def latent_router_gap(module, x):
    """The DeepSeek/Kimi routers (spec §3.6, §3.7) recomputed from their input: the smallest gap,
    over the prompt's tokens, between the k-th and (k+1)-th selection score after the group mask
    (biased sigmoid scores, or softmax probabilities), and between the last kept and first
    dropped group score. Near-ties would make the expert choice fragile under f32 noise."""
    logits = x.reshape(-1, module.weight.shape[1]).float() @ module.weight.float().T
    e, k = module.weight.shape[0], module.top_k
    groups = getattr(module, "num_group", None) or 1
    topk_group = getattr(module, "topk_group", None) or 1
    method = getattr(module, "topk_method", "noaux_tc")
    if hasattr(module, "e_score_correction_bias"):
        choice = logits.sigmoid() + module.e_score_correction_bias
        gscore = choice.view(-1, groups, e // groups).topk(min(2, e // groups), dim=-1)[0].sum(-1)
        fill = float("-inf")
    else:
        choice = logits.softmax(-1)
        if method == "greedy":
            groups, topk_group = 1, 1
        gscore = choice.view(-1, groups, e // groups).max(-1).values
        fill = 0.0
    group_gap = None
    if groups > 1 and topk_group < groups:
        gs = gscore.sort(-1, descending=True).values
        group_gap = float((gs[:, topk_group - 1] - gs[:, topk_group]).min())
        keep = torch.zeros_like(gscore).scatter_(1, gscore.topk(topk_group, -1)[1], 1.0)
        mask = keep.unsqueeze(-1).expand(-1, groups, e // groups).reshape(-1, e).bool()
        choice = choice.masked_fill(~mask, fill)
    top = choice.sort(-1, descending=True).values
    return float((top[:, k - 1] - top[:, k]).min()), group_gap


def watch_clipping(model, clip):
    """Hooks that count, per layer, the q, k and v entries the clamp to [-clip, clip] changes:
    the outputs of q_norm, k_norm and v_proj, read before the in-place clamp that follows them."""
    counts, hooks = [], []
    for i, layer in enumerate(model.model.layers):
        counts.append({})
        for tag, mod in (("q", layer.self_attn.q_norm), ("k", layer.self_attn.k_norm), ("v", layer.self_attn.v_proj)):
            def hook(_m, _inp, out, i=i, tag=tag):
                if tag not in counts[i]:
                    counts[i][tag] = float((out.abs() > clip).float().mean())
            hooks.append(mod.register_forward_hook(hook))
    return counts, hooks


def contrast_of(mdir, overrides, x, logits, window):
    """Logits of the saved bytes reloaded with `overrides` applied to the config; their distance
    from the reference, and (for a sliding window W) the agreement of the first W positions,
    where a window cannot change anything."""
    other = reload_with(mdir, overrides)
    for k, v in overrides.items():
        got = getattr(other.config, k)
        if isinstance(v, dict):
            # transformers standardises a rope_parameters dict (adds its defaults): compare the
            # keys given, and that the ones left out stayed out.
            assert all(got.get(kk) == vv for kk, vv in v.items()), f"contrast override {k} did not take: {got}"
        else:
            assert got == v, f"contrast override {k} did not take"
    with torch.no_grad():
        alt = other(x, use_cache=False).logits[0].float().numpy()
    scale = float(np.abs(logits).max())
    per_pos = np.abs(alt - logits).max(-1) / scale
    out = dict(overrides=overrides, logits_rel_diff=float(per_pos.max()),
               note="max|ref - contrast| / max|ref| over every position: how far the fixture is "
                    "from the same weights with these config fields changed")
    if window:
        out["rel_diff_before_window"] = float(per_pos[:window].max())
        out["rel_diff_from_window_on"] = float(per_pos[window:].max())
        out["first_position_that_differs"] = int(np.argmax(per_pos > 0)) if (per_pos > 0).any() else None
    return out


def cached_decode_record(model, x, d, prefill):
    """transformers' cached path (spec §4.6, oracle_common.cached_decode) with what meta.json says of it."""
    dec, rel = cached_decode(model, x, d, prefill)
    return dict(logits=dec, prefill_len=d, positions=[d - 1, int(x.shape[1]) - 1], rel_diff_vs_prefill=rel,
                note="decode_logits.f32 rows are positions d-1 .. T-1 from the cached decode; "
                     "rel_diff_vs_prefill is max|decode - prefill| / max|prefill| over those rows")


def bias_contrast_of(model, x, logits):
    """The same weights with every e_score_correction_bias zeroed: how far the logits move, and on
    how many (layer, token) pairs the selected expert set changes."""
    changed, busy = [], []

    def watch(module, inputs, output):
        if busy:
            return  # the zero-bias call below runs this hook too
        idx = output[2]
        with torch.no_grad():
            busy.append(True)
            saved = module.e_score_correction_bias.clone()
            module.e_score_correction_bias.zero_()
            other = module(inputs[0])[2]
            module.e_score_correction_bias.copy_(saved)
            busy.pop()
        a, b = idx.sort(-1).values, other.sort(-1).values
        changed.append(int((a != b).any(-1).sum()))

    forward_watching_routers(model, x, watch, biased_only=True)
    rel = rel_diff(zero_bias_logits(model, x), logits)
    return dict(logits_rel_diff=rel, tokens_with_other_experts=sum(changed),
                note="max|ref - zero-bias| / max|ref|, and the (MoE layer, token) pairs whose selected "
                     "experts differ without the bias (the bias is for selection only, spec §3.6)")


def build(name, spec, out_root):
    started = time.time()
    model_type, _, model = tiny_model(spec["config"], SEED)
    kwargs = {k: v for k, v in spec["config"].items() if k != "model_type"}
    randomise(model, SEED, **spec.get("randomise", {}))

    vdir = os.path.join(out_root, name)
    mdir = os.path.join(vdir, "model")
    os.makedirs(mdir, exist_ok=True)
    model.save_pretrained(mdir)
    del model
    strip = spec.get("strip_saved_config", [])
    if strip:
        # An older config.json generation, without the fields transformers 5 derives and saves.
        cpath = os.path.join(mdir, "config.json")
        with open(cpath) as f:
            saved = json.load(f)
        for key in strip:
            del saved[key]
        with open(cpath, "w") as f:
            f.write(json.dumps(saved, indent=2, sort_keys=True) + "\n")

    # Reload: the reference is computed from what is on disk, nothing else.
    model, _ = reload(mdir, name)

    # Smallest gap between the k-th and (k+1)-th router probability over every MoE layer and
    # prompt token, captured from the routers' own inputs: a gap near f32 noise would make the
    # expert choice fragile (spec §2.5).
    top_k = getattr(model.config, "num_experts_per_tok", None)
    gaps, hooks = [], []

    def watch_router(module, inputs, _output):
        if len(gaps) < len(hooks):
            probs = torch.softmax(inputs[0].reshape(-1, module.weight.shape[1]) @ module.weight.T, dim=-1)
            top = probs.topk(top_k + 1, dim=-1).values
            gaps.append(float((top[:, top_k - 1] - top[:, top_k]).min()))

    group_gaps = []

    def watch_latent_router(module, inputs, _output):
        if len(gaps) < len(hooks):
            gap, ggap = latent_router_gap(module, inputs[0])
            gaps.append(gap)
            if ggap is not None:
                group_gaps.append(ggap)

    if top_k:
        for layer in model.model.layers:
            gate = getattr(layer.mlp, "gate", None)
            if gate is not None and hasattr(gate, "weight") and gate.weight.shape[0] > top_k:
                latent = hasattr(gate, "e_score_correction_bias") or hasattr(gate, "topk_method")
                hooks.append(gate.register_forward_hook(watch_latent_router if latent else watch_router))
        assert hooks, f"{name}: no router found to watch"
    clip = getattr(model.config, "clip_qkv", None)
    clip_counts, clip_hooks = watch_clipping(model, clip) if clip else ([], [])

    ids = prompt_ids(spec["prompt_len"], VOCAB, 11, 5, 17, bos=1)
    # The hooks watch the prompt's forward only; the cached greedy decode must agree with one
    # uncached forward over prompt + continuation.
    ref = reference_run(model, name, ids, NEW_TOKENS, remove_after_forward=hooks + clip_hooks)
    x, logits, hidden, new_ids = ref.x, ref.logits, ref.hidden, ref.new_ids
    decode = None
    if spec.get("decode_from"):
        decode = cached_decode_record(model, x, spec["decode_from"], logits)
        write_f32(os.path.join(vdir, "decode_logits.f32"), decode.pop("logits"))
    bias_contrast = None
    if spec.get("bias_contrast"):
        bias_contrast = bias_contrast_of(model, x, logits)
        assert bias_contrast["logits_rel_diff"] >= MIN_CONTRAST, f"{name}: the bias hardly matters: {bias_contrast}"
        assert bias_contrast["tokens_with_other_experts"] > 0, f"{name}: the bias changes no expert choice"
    router_gap = min(gaps) if gaps else None
    structure = structure_of(model)
    contrast = None
    if "contrast" in spec:
        contrast = contrast_of(mdir, spec["contrast"], x, logits, spec.get("window"))
        assert contrast["logits_rel_diff"] >= MIN_CONTRAST, f"{name}: contrast {contrast} below {MIN_CONTRAST}"
        if spec.get("window"):
            assert contrast["rel_diff_before_window"] < 1e-6, f"{name}: the window changed early positions: {contrast}"
    if clip:
        assert all(0.05 < c[t] < 0.95 for c in clip_counts for t in "qkv"), f"{name}: clip fractions {clip_counts}"

    write_reference(vdir, ids, new_ids, logits, hidden)

    meta = dict(
        name=name, model_type=model_type, architecture=model.config.architectures[0],
        transformers=transformers.__version__, torch=torch.__version__, numpy=np.__version__,
        storage_dtype="float32", compute_dtype="float32", attn_implementation="eager", device="cpu",
        seed=SEED, randomisation="norm weights 1 + 0.2*N(0,1), every other parameter 0.15*N(0,1)",
        prompt_len=len(ids), new_tokens=NEW_TOKENS,
        logits_shape=list(logits.shape), hidden_states_shape=list(hidden.shape),
        logits_absmax=float(np.abs(logits).max()),
        greedy_matches_uncached_argmax=True, min_router_topk_gap=router_gap,
        config=kwargs, stripped_from_saved_config=strip or None, layers=structure, n_params=int(sum(p.numel() for p in model.parameters())),
        **digests_meta(vdir, mdir, ("logits.f32", "hidden_states.npy", "input_ids.json")),
        seconds=round(time.time() - started, 2),
    )
    if contrast is not None:
        meta["contrast"] = contrast
    if group_gaps:
        meta["min_router_group_gap"] = min(group_gaps)
    if decode is not None:
        meta["decode"] = decode
        meta["outputs"]["decode_logits.f32"] = sha256_of(os.path.join(vdir, "decode_logits.f32"))
    if bias_contrast is not None:
        meta["bias_contrast"] = bias_contrast
    if clip:
        meta["clipped_fraction"] = dict(
            clip_qkv=clip, per_layer=clip_counts,
            note="share of q (after q_norm), k (after k_norm) and v entries with |x| > clip_qkv, "
                 "i.e. changed by the clamp, over the prompt")
    write_meta(vdir, meta)
    print(f"{name:18s} params={meta['n_params']} tensors={len(meta['tensors'])} T={len(ids)} "
          f"greedy={new_ids} router_gap={router_gap} "
          f"contrast={contrast and contrast['logits_rel_diff']} {meta['seconds']}s")


if __name__ == "__main__":
    run_variants(__doc__, VARIANTS, build)
