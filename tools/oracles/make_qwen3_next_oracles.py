#!/usr/bin/env python3
"""Reference fixtures for Qwen3-Next (`Qwen3NextForCausalLM`, transformers 5.24.0 `qwen3_next`).

Modelled on the shared generator (../shared/oracles/scripts/make_model_oracles.py) and on
tools/oracles/make_glm_oracles.py: a tiny config, every parameter overwritten deterministically and
well scaled, save_pretrained, then RELOADED from disk so that the reference comes from exactly the
bytes the engine reads; CPU, float32 compute, eager attention. The `fla` and `causal_conv1d`
packages are not installed, so transformers runs its torch fallbacks (torch_chunk_gated_delta_rule
for a prefill, torch_recurrent_gated_delta_rule for one cached token, the torch causal conv1d).

Randomisation (in parameter-name order, one generator):
  - zero-centred RMSNorms (input/post-attention/final norms, q_norm, k_norm; the model multiplies
    by 1 + w): w = 0.1*N, so the gain is not 1 and the stored value is not its identity 0;
  - the gated RMSNorm of the linear attention (multiplies by w): 1 + 0.1*N;
  - A_log = -1 + 0.5*N and dt_bias = 0.5*N (per value head): decays exp(g) spread around 0.6, so
    the recurrence carries information across the whole prompt;
  - embeddings 0.5*N; matrices (conv1d kernels included) N / sqrt(fan_in).

Each variant writes, in the layout of the other oracle fixtures:
  <out>/<name>/model/{config.json, generation_config.json, model.safetensors}
  <out>/<name>/input_ids.json     {"prompt_ids": [...], "greedy_new_ids": [...]} (greedy with the cache)
  <out>/<name>/logits.f32         raw little-endian f32 [T, vocab]: every prompt position, one uncached forward
  <out>/<name>/hidden_states.npy  f32 [layers + 1, T, hidden]
  <out>/<name>/decode_logits.f32  raw f32 [T - d + 1, vocab]: positions d-1 .. T-1 from transformers' cached
                                  decode (a d-token prefill with the cache, then one token at a time)
  <out>/<name>/meta.json          versions, parameters, tensors, sha256 of every file, contrasts

Usage (the pinned reference environment, transformers 5.24.0):
  /work/pyenv/venv/bin/python tools/oracles/make_qwen3_next_oracles.py --out tests/fixtures/oracles [--only NAME ...]
"""
import os
import sys
import time

import numpy as np
import torch
import transformers
from transformers.models.qwen3_next import modeling_qwen3_next as qn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # oracle_common.py, from any working directory
from oracle_common import (cached_decode, contrast_of, digests_meta, forward_watching_routers,  # noqa: E402
                           overwrite_from_seed, prompt_ids, reference_run, reload, run_variants, tiny_model,
                           write_f32, write_meta, write_reference)

SEED = 3803
VOCAB = 256
NEW_TOKENS = 8
MIN_CONTRAST = 1e-3

TINY = dict(model_type="qwen3_next", vocab_size=VOCAB, hidden_size=64, intermediate_size=96,
            num_attention_heads=4, num_key_value_heads=2, head_dim=32,
            max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=False,
            bos_token_id=1, eos_token_id=2, pad_token_id=0, hidden_act="silu", attention_bias=False,
            linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=8,
            linear_num_key_heads=2, linear_num_value_heads=4,
            moe_intermediate_size=16, shared_expert_intermediate_size=32, num_experts=8,
            num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
            rope_parameters=dict(rope_type="default", rope_theta=1e4, partial_rotary_factor=0.25))

VARIANTS = {
    # 4 layers, full attention every 2nd (linear, full, linear, full); 2 key heads serving 4 value
    # heads in the Gated DeltaNet (each key head's group of 2 value heads); rotary on a quarter of
    # a head_dim of 32 (4 pairs); 8 experts, top-2 renormalised, one gated shared expert.
    "qwen3_next_f32": dict(dtype="float32", prompt_len=32, decode_from=12,
        contrasts=dict(all_full=dict(layer_types=["full_attention"] * 4)),
        config=dict(TINY, num_hidden_layers=4, full_attention_interval=2)),
    "qwen3_next_bf16": dict(dtype="bfloat16", prompt_len=32, decode_from=12,
        config=dict(TINY, num_hidden_layers=4, full_attention_interval=2)),
}


def randomise(model, seed):
    """The rules of the module docstring, through overwrite_from_seed."""
    centred = set()
    for mname, m in model.named_modules():
        if isinstance(m, qn.Qwen3NextRMSNorm):
            centred.add(mname + ".weight")

    def weight(name, p, v):
        if name in centred:
            return 0.1 * v
        if name.endswith("A_log"):
            return -1.0 + 0.5 * v
        if name.endswith("dt_bias"):
            return 0.5 * v
        if name.endswith(".bias"):
            return 0.1 * v
        if p.dim() == 1 or "norm" in name:
            return 1.0 + 0.1 * v
        if "embed_tokens" in name:
            return 0.5 * v
        return v / (p.shape[-1] ** 0.5)

    overwrite_from_seed(model, seed, weight)


def router_gap(model, x):
    """Smallest gap over the prompt between the k-th and (k+1)-th routing probability."""
    gaps = []

    def watch(module, inputs, _out):
        p = torch.softmax(inputs[0].reshape(-1, module.hidden_dim).float() @ module.weight.float().T, -1)
        top = p.sort(-1, descending=True).values
        gaps.append(float((top[:, module.top_k - 1] - top[:, module.top_k]).min()))

    forward_watching_routers(model, x, watch)
    return min(gaps)


def build(name, spec, out_root):
    started = time.time()
    storage = dict(float32=torch.float32, bfloat16=torch.bfloat16)[spec["dtype"]]
    model_type, config, model = tiny_model(spec["config"], SEED)
    randomise(model, SEED)
    vdir = os.path.join(out_root, name)
    mdir = os.path.join(vdir, "model")
    os.makedirs(mdir, exist_ok=True)
    model.to(storage)
    model.save_pretrained(mdir)
    del model

    model, _ = reload(mdir, name)
    types = model.config.layer_types
    assert "linear_attention" in types and "full_attention" in types, types

    n = spec["prompt_len"]
    ids = prompt_ids(n, VOCAB, 13, 7, 5, bos=1)
    ref = reference_run(model, name, ids, NEW_TOKENS)
    x, logits, new_ids = ref.x, ref.logits, ref.new_ids
    dec, dec_rel = cached_decode(model, x, spec["decode_from"], logits)
    gap = router_gap(model, x)
    contrasts = {k: contrast_of(mdir, v, x, logits, MIN_CONTRAST) for k, v in spec.get("contrasts", {}).items()}

    write_reference(vdir, ids, new_ids, logits, ref.hidden)
    write_f32(os.path.join(vdir, "decode_logits.f32"), dec)
    meta = dict(
        name=name, model_type=model_type, architecture=model.config.architectures[0],
        transformers=transformers.__version__, torch=torch.__version__, numpy=np.__version__,
        generator="tools/oracles/make_qwen3_next_oracles.py", seed=SEED, storage_dtype=spec["dtype"],
        compute_dtype="float32", attn_implementation="eager", device="cpu",
        delta_rule="torch_chunk_gated_delta_rule (prefill), torch_recurrent_gated_delta_rule (cached token)",
        randomisation="zero-centred norms 0.1*N, gated norm 1 + 0.1*N, A_log -1 + 0.5*N, dt_bias 0.5*N, "
                      "embeddings 0.5*N, matrices N/sqrt(fan_in)",
        prompt_len=n, new_tokens=NEW_TOKENS, config=spec["config"], layer_types=types,
        logits_absmax=float(np.abs(logits).max()),
        decode=dict(prefill_len=spec["decode_from"], positions=[spec["decode_from"] - 1, n - 1],
                    rel_diff_vs_prefill=dec_rel),
        min_router_topk_gap=gap, contrasts=contrasts,
        n_params=int(sum(p.numel() for p in model.parameters())),
        **digests_meta(vdir, mdir, ("logits.f32", "decode_logits.f32", "hidden_states.npy", "input_ids.json")),
        seconds=round(time.time() - started, 2),
    )
    write_meta(vdir, meta)
    print(f"{name}: params={meta['n_params']} tensors={len(meta['tensors'])} T={n} greedy={new_ids} "
          f"gap={gap:.3g} decode_rel={dec_rel:.2e} "
          f"contrasts={ {k: round(v['logits_rel_diff'], 4) for k, v in contrasts.items()} } {meta['seconds']}s")


if __name__ == "__main__":
    run_variants(__doc__, VARIANTS, build)
