#!/usr/bin/env python3
"""Reference fixtures for GLM-4.5 / 4.6 (`Glm4MoeForCausalLM`, transformers 5.24.0 `glm4_moe`).

Modelled on the shared generator (../shared/oracles/scripts/make_model_oracles.py): a tiny config,
every parameter overwritten deterministically and well scaled (RMSNorm gains 1 + 0.1*N(0,1), so
not 1; attention biases 0.1*N; embeddings 0.5*N; matrices N / sqrt(fan_in); the routers'
e_score_correction_bias 0.3*N, not 0), save_pretrained, then RELOADED from disk so that the
reference comes from exactly the bytes the engine reads; CPU, float32 compute, eager attention.

Each variant writes, in the layout of the other oracle fixtures:

  <out>/<name>/model/{config.json, generation_config.json, model.safetensors}
  <out>/<name>/input_ids.json     {"prompt_ids": [...], "greedy_new_ids": [...]} (greedy with the KV cache)
  <out>/<name>/logits.f32         raw little-endian f32 [T, vocab]: every prompt position, one uncached forward
  <out>/<name>/hidden_states.npy  f32 [layers + 1, T, hidden] (embeddings, each layer; final norm on the last)
  <out>/<name>/decode_logits.f32  raw f32 [T - d + 1, vocab]: positions d-1 .. T-1 from transformers' *cached*
                                  decode (a d-token prefill with use_cache, then one token at a time)
  <out>/<name>/meta.json          versions, the generator's parameters (config, seed, storage dtype), tensor
                                  names/shapes/dtypes, sha256 of every file, per-layer FFN kind, the smallest
                                  router gaps, and contrasts: how far the logits move when a feature the
                                  fixture is about is switched off on the same bytes

What the variants cover (issue 17, GLM part): first_k_dense_replace, n_group > 1 with
topk_group < n_group, shared experts, partial_rotary_factor 0.5, use_qk_norm true and false,
attention_bias (q/k/v), norm_topk_prob both ways, routed_scaling_factor, head_dim != hidden/heads,
f32 and bf16 storage, and a checkpoint holding an MTP layer's tensors (num_nextn_predict_layers 1:
`model.layers.<num_hidden_layers>.*`, which save_pretrained drops, added here as released GLM
checkpoints carry them: eh_proj, enorm, hnorm, shared_head.norm and a whole decoder layer).
transformers reports them as unexpected keys and never runs them; the engine must skip them too.

Usage (the pinned reference environment, transformers 5.24.0):
  /work/pyenv/venv/bin/python tools/oracles/make_glm_oracles.py --out tests/fixtures/oracles [--only NAME ...]
"""
import json
import os
import sys
import time

import numpy as np
import torch
import transformers
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # oracle_common.py, from any working directory
from oracle_common import (cached_decode, contrast_of, digests_meta, forward_watching_routers,  # noqa: E402
                           overwrite_from_seed, prompt_ids, reference_run, rel_diff, reload, run_variants,
                           tiny_model, write_f32, write_meta, write_reference, zero_bias_logits)

SEED = 4505
VOCAB = 256
NEW_TOKENS = 8
MIN_CONTRAST = 1e-3  # 50x the engine tests' 2e-5: an engine ignoring the feature cannot pass

TINY = dict(model_type="glm4_moe", vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
            moe_intermediate_size=32, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=512, rms_norm_eps=1e-5, tie_word_embeddings=False,
            bos_token_id=1, eos_token_id=2, pad_token_id=0, hidden_act="silu")

# GLM-4.5's switches (attention_bias, use_qk_norm, partial rotary 0.5 of a head_dim of 32 = 8
# rotated pairs of 16 channels, the other 16 pass), layer 0 dense, 8 experts in 4 groups of which
# the best 2 are kept, top-3 renormalised x2.5, one shared expert, one MTP layer declared.
GLM45 = dict(TINY, num_hidden_layers=3, head_dim=32, attention_bias=True, use_qk_norm=True,
             rope_parameters=dict(rope_type="default", rope_theta=1e6, partial_rotary_factor=0.5),
             n_routed_experts=8, num_experts_per_tok=3, n_group=4, topk_group=2, n_shared_experts=1,
             first_k_dense_replace=1, norm_topk_prob=True, routed_scaling_factor=2.5,
             num_nextn_predict_layers=1)

VARIANTS = {
    # GLM45 as save_pretrained writes it: the config declares one MTP layer whose tensors this
    # checkpoint lacks (the bf16 twin carries them). 32-token prompt; cached decode from 12 tokens on.
    "glm4_moe_f32": dict(dtype="float32", prompt_len=32, decode_from=12,
        contrasts=dict(groups=dict(n_group=1, topk_group=1),
                       full_rotary=dict(rope_parameters=dict(rope_type="default", rope_theta=1e6, partial_rotary_factor=1.0))),
        config=GLM45),
    # The same model stored as BF16 (router correction bias kept in F32, as released), with an
    # MTP layer's tensors added to the checkpoint.
    "glm4_moe_bf16": dict(dtype="bfloat16", prompt_len=32, decode_from=12, mtp_tensors=True, config=GLM45),
    # No q/k norm, head_dim = hidden / heads = 16 (4 rotated pairs), two dense layers, one group,
    # raw top-2 weights (norm_topk_prob false) x1.5, two shared experts (64 wide), dense width 64,
    # no MTP layer.
    # config.json is rewritten in the release's spelling (top-level rope_theta and
    # partial_rotary_factor, no rope_parameters), which transformers still reads.
    "glm4_moe_noqk_f32": dict(dtype="float32", prompt_len=24, decode_from=8, release_spelling=True,
        contrasts=dict(qk_norm=dict(use_qk_norm=True)),
        config=dict(TINY, num_hidden_layers=4, head_dim=16, intermediate_size=64, attention_bias=True, use_qk_norm=False,
                    rope_parameters=dict(rope_type="default", rope_theta=1e4, partial_rotary_factor=0.5),
                    n_routed_experts=8, num_experts_per_tok=2, n_group=1, topk_group=1, n_shared_experts=2,
                    first_k_dense_replace=2, norm_topk_prob=False, routed_scaling_factor=1.5,
                    num_nextn_predict_layers=0)),
}


def weight(name, p, v):
    """Deterministic, well-scaled values for every floating parameter and buffer (overwrite_from_seed)."""
    if name.endswith("e_score_correction_bias"):
        return 0.3 * v
    if name.endswith(".bias"):
        return 0.1 * v
    if p.dim() == 1 or "norm" in name:
        return 1.0 + 0.1 * v
    if "embed_tokens" in name:
        return 0.5 * v
    return v / (p.shape[-1] ** 0.5)


def mtp_tensors(saved, h, layers, seed, dtype):
    """The tensors of a GLM MTP layer at index `layers`: a decoder layer's own (the saved last
    layer's names and shapes, per-expert as released checkpoints have them, fresh values) and
    the MTP head's projections and norms."""
    g = torch.Generator().manual_seed(seed + 1)
    last = f"model.layers.{layers - 1}."
    out = {}
    sd = saved
    for k in sorted(sd):
        if k.startswith(last):
            t = sd[k]
            out[f"model.layers.{layers}." + k[len(last):]] = torch.randn(t.shape, generator=g).to(t.dtype)
    for name, shape in [("eh_proj.weight", (h, 2 * h)), ("enorm.weight", (h,)), ("hnorm.weight", (h,)),
                        ("shared_head.norm.weight", (h,))]:
        out[f"model.layers.{layers}.{name}"] = torch.randn(shape, generator=g).to(dtype)
    return out


def router_gaps(model, x):
    """Smallest gap over the prompt between the k-th and (k+1)-th biased score after the group
    mask, and between the last kept and first dropped group: near-ties would make the expert
    choice fragile under f32 summation-order noise."""
    gaps, group_gaps = [], []

    def watch(module, inputs, _out):
        logits = inputs[0].reshape(-1, module.weight.shape[1]).float() @ module.weight.float().T
        e, k, groups, keep = module.weight.shape[0], module.top_k, module.num_group, module.topk_group
        choice = logits.sigmoid() + module.e_score_correction_bias
        if groups > 1 and keep < groups:
            gs = choice.view(-1, groups, e // groups).topk(2, dim=-1)[0].sum(-1)
            srt = gs.sort(-1, descending=True).values
            group_gaps.append(float((srt[:, keep - 1] - srt[:, keep]).min()))
            mask = torch.zeros_like(gs).scatter_(1, gs.topk(keep, -1)[1], 1.0)
            mask = mask.unsqueeze(-1).expand(-1, groups, e // groups).reshape(-1, e).bool()
            choice = choice.masked_fill(~mask, float("-inf"))
        top = choice.sort(-1, descending=True).values
        gaps.append(float((top[:, k - 1] - top[:, k]).min()))

    forward_watching_routers(model, x, watch, biased_only=True)
    return min(gaps), (min(group_gaps) if group_gaps else None)


def bias_contrast_of(model, x, logits):
    rel = rel_diff(zero_bias_logits(model, x), logits)
    assert rel >= MIN_CONTRAST, f"the correction bias hardly matters: {rel}"
    return dict(logits_rel_diff=rel, note="max|ref - zero-bias| / max|ref|: the bias chooses experts")


def release_spelling(mdir):
    """config.json as GLM-4.5's release spells the rope: top-level rope_theta and
    partial_rotary_factor (transformers 4), no rope_parameters."""
    path = os.path.join(mdir, "config.json")
    with open(path) as f:
        c = json.load(f)
    rp = c.pop("rope_parameters")
    c["rope_theta"] = rp["rope_theta"]
    c["partial_rotary_factor"] = rp["partial_rotary_factor"]
    with open(path, "w") as f:
        f.write(json.dumps(c, indent=2, sort_keys=True) + "\n")


def build(name, spec, out_root):
    started = time.time()
    storage = dict(float32=torch.float32, bfloat16=torch.bfloat16)[spec["dtype"]]
    model_type, config, model = tiny_model(spec["config"], SEED)
    overwrite_from_seed(model, SEED, weight)
    vdir = os.path.join(out_root, name)
    mdir = os.path.join(vdir, "model")
    os.makedirs(mdir, exist_ok=True)
    model.to(storage)
    if storage != torch.float32:
        for bname, b in model.named_buffers():
            if bname.endswith("e_score_correction_bias"):
                b.data = b.data.float()
    model.save_pretrained(mdir)
    layers = config.num_hidden_layers
    mtp = []
    if spec.get("mtp_tensors"):
        path = os.path.join(mdir, "model.safetensors")
        sd = load_file(path)
        extra = mtp_tensors(sd, config.hidden_size, layers, SEED, storage)
        assert not any(k in sd for k in extra)
        sd.update(extra)
        save_file(sd, path, metadata={"format": "pt"})
        mtp = sorted(extra)
    del model
    if spec.get("release_spelling"):
        release_spelling(mdir)

    model, info = reload(mdir, name, tolerate_unexpected=True)
    unexpected = sorted(info.get("unexpected_keys") or [])
    # Only the MTP layer is left unread (transformers builds num_hidden_layers layers).
    assert all(k.startswith(f"model.layers.{layers}.") for k in unexpected), unexpected
    assert bool(unexpected) == bool(mtp), (unexpected, mtp)
    rp = model.config.rope_parameters
    assert rp["partial_rotary_factor"] == 0.5, rp
    assert model.model.rotary_emb.inv_freq.numel() * 2 == int(model.config.head_dim * 0.5)

    n = spec["prompt_len"]
    ids = prompt_ids(n, VOCAB, 13, 7, 5, bos=1)
    ref = reference_run(model, name, ids, NEW_TOKENS)
    x, logits, new_ids = ref.x, ref.logits, ref.new_ids
    dec, dec_rel = cached_decode(model, x, spec["decode_from"], logits)
    gap, group_gap = router_gaps(model, x)
    bias = bias_contrast_of(model, x, logits)
    contrasts = {k: contrast_of(mdir, v, x, logits, MIN_CONTRAST) for k, v in spec.get("contrasts", {}).items()}

    write_reference(vdir, ids, new_ids, logits, ref.hidden)
    write_f32(os.path.join(vdir, "decode_logits.f32"), dec)
    meta = dict(
        name=name, model_type=model_type, architecture=model.config.architectures[0],
        transformers=transformers.__version__, torch=torch.__version__, numpy=np.__version__,
        generator="tools/oracles/make_glm_oracles.py", seed=SEED, storage_dtype=spec["dtype"],
        compute_dtype="float32", attn_implementation="eager", device="cpu",
        randomisation="norm gains 1 + 0.1*N, biases 0.1*N, correction bias 0.3*N, embeddings 0.5*N, "
                      "matrices N/sqrt(fan_in)",
        prompt_len=n, new_tokens=NEW_TOKENS, config=spec["config"],
        release_spelling=bool(spec.get("release_spelling")),
        layers=[dict(ffn="moe" if hasattr(l.mlp, "experts") else "dense") for l in model.model.layers],
        mtp_tensors=mtp, logits_absmax=float(np.abs(logits).max()),
        decode=dict(prefill_len=spec["decode_from"], positions=[spec["decode_from"] - 1, n - 1],
                    rel_diff_vs_prefill=dec_rel),
        min_router_topk_gap=gap, min_router_group_gap=group_gap, bias_contrast=bias, contrasts=contrasts,
        n_params=int(sum(p.numel() for p in model.parameters())),
        **digests_meta(vdir, mdir, ("logits.f32", "decode_logits.f32", "hidden_states.npy", "input_ids.json")),
        seconds=round(time.time() - started, 2),
    )
    write_meta(vdir, meta)
    print(f"{name}: params={meta['n_params']} tensors={len(meta['tensors'])} T={n} greedy={new_ids} "
          f"gap={gap:.3g} group_gap={group_gap} decode_rel={dec_rel:.2e} bias={bias['logits_rel_diff']:.3g} "
          f"contrasts={ {k: round(v['logits_rel_diff'], 4) for k, v in contrasts.items()} } {meta['seconds']}s")


if __name__ == "__main__":
    run_variants(__doc__, VARIANTS, build)
