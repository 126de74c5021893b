#!/usr/bin/env python3
"""Reference fixtures for FP8 block-scaled checkpoints (DeepSeek-V3 family, Kimi-K2; issue 17).

Real DeepSeek-V3/R1/V3.1 and Kimi-K2 checkpoints store the linear weights of attention and of
every MLP (dense, shared and routed experts) as F8_E4M3, each with an f32 `weight_scale_inv`
tensor of one value per `weight_block_size` block (partial blocks at the right and bottom
edges); the embeddings, norms, router and lm_head stay in BF16 (the router's correction bias in
F32). config.json carries

  "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                          "weight_block_size": [R, C]}

and a stored weight means  w = e4m3 * scale_inv  for its block.

This script makes two tiny such checkpoints: a DeepSeek-V3-shaped one and a Kimi-K2-shaped one
(Kimi-K2 is DeepseekV3ForCausalLM with its own values: more experts, a single expert group, a
different routed_scaling_factor and YaRN setting). For each:

 1. build the float model from a tiny config and randomise it from a fixed seed;
 2. save_pretrained it into a scratch directory (the Hugging Face tensor names);
 3. quantize the weights real checkpoints store as FP8 to e4m3 with per-block scales
    (scale = amax / 448 over the block, 1 for an all-zero block) and write the FP8 checkpoint:
    F8_E4M3 weights + F32 `<name>_scale_inv`, everything else BF16 (bias F32);
 4. read that file back, dequantize (e4m3 -> f32, times the block's scale_inv), write the
    dequantized weights as an F32 checkpoint, and load THAT with transformers (float32, eager):
    the reference logits are transformers' on exactly the values the FP8 file decodes to.

The block sizes are small (the real [128, 128] would cover a whole tiny matrix) and chosen so
that several matrices end in partial blocks along rows and along columns; the column block is
a multiple of 32 and every expert matrix has a multiple of 32 columns, so the container's
`--experts fp8` record can keep the experts' bytes and scales as they are.

Output, per fixture (the layout of the other oracle fixtures):
  <out>/<name>/model/{config.json, generation_config.json, model.safetensors}   (the FP8 checkpoint)
  <out>/<name>/input_ids.json   {"prompt_ids": [...], "greedy_new_ids": [...]}
  <out>/<name>/logits.f32       raw little-endian f32 [T, vocab], every prompt position
  <out>/<name>/meta.json        versions, config, tensors, file digests, e4m3 statistics

Also writes <out>/e4m3_table.f32: the 256 e4m3fn codes decoded by torch (code 0x7f and 0xff NaN),
the independent reference of the engine's decoder test.

Usage: /work/pyenv/venv/bin/python tools/oracles/make_fp8_oracles.py --out tests/fixtures/oracles
"""
import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time

import numpy as np
import torch
import transformers
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # oracle_common.py, from any working directory
from oracle_common import (file_digests, overwrite_from_seed, prompt_ids, reload, tensors_of, tiny_model,  # noqa: E402
                           write_meta, write_reference)

SEED = 1717
VOCAB = 256
PROMPT_LEN = 24
NEW_TOKENS = 8
E4M3_MAX = 448.0

YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 128,
        "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}

# What the two fixtures share: MLA with q-LoRA, 3 layers of which layer 0 is dense, one shared
# expert, top-k renormalised, interleaved RoPE, untied.
DSV3_TINY = dict(
    model_type="deepseek_v3", vocab_size=VOCAB, moe_intermediate_size=32, num_hidden_layers=3,
    num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1, topk_group=1, first_k_dense_replace=1,
    norm_topk_prob=True, q_lora_rank=48, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
    max_position_embeddings=512, rms_norm_eps=1e-6, rope_interleave=True, tie_word_embeddings=False,
    bos_token_id=0, eos_token_id=1)

FIXTURES = {
    # DeepSeek-V3 shape: 8 experts in 2 groups, top-2, 1 shared, layer 0 dense; hidden 96 under
    # 64-wide blocks ends every hidden-wide row and column in a partial block of 32.
    "deepseek_v3_fp8": dict(block=[64, 64], cfg=dict(
        DSV3_TINY, hidden_size=96, intermediate_size=160, n_routed_experts=8, num_experts_per_tok=2, n_group=2,
        routed_scaling_factor=2.5, rope_parameters=YARN)),
    # Kimi-K2 values (n_group 1, top-k 8 of 384 -> 4 of 16 here, routed_scaling_factor 2.827,
    # YaRN with beta_fast = beta_slow = 1), [32, 32] blocks: kv_a_proj's 24 rows, q_b_proj's 48
    # columns and kv_b_proj's 16 are partial blocks.
    "kimi_k2_fp8": dict(block=[32, 32], cfg=dict(
        DSV3_TINY, hidden_size=64, intermediate_size=96, n_routed_experts=16, num_experts_per_tok=4, n_group=1,
        routed_scaling_factor=2.827,
        rope_parameters=dict(YARN, factor=8.0, original_max_position_embeddings=64, beta_fast=1.0, beta_slow=1.0))),
}

# The linear weights real checkpoints store as FP8 (DeepSeek's and Moonshot's release files).
FP8_WEIGHT = re.compile(r"^model\.layers\.\d+\.(self_attn\.(q_proj|q_a_proj|q_b_proj|kv_a_proj_with_mqa|kv_b_proj|o_proj)"
                        r"|mlp\.(shared_experts\.|experts\.\d+\.)?(gate_proj|up_proj|down_proj))\.weight$")


def weight(name, p, noise):
    """Every floating parameter and buffer (overwrite_from_seed): norms 1 + 0.2 N, embeddings
    0.5 N, weights N / sqrt(fan_in), the router's correction bias 0.1 N."""
    if name.endswith("e_score_correction_bias"):
        return 0.1 * noise
    if "norm" in name:
        return 1.0 + 0.2 * noise
    if "embed_tokens" in name:
        return 0.5 * noise
    return noise / (p.shape[-1] ** 0.5)


def quantize(w, block):
    """w [R, C] f32 -> (e4m3 codes [R, C], scale_inv f32 [ceil(R/br), ceil(C/bc)])."""
    br, bc = block
    rows, cols = w.shape
    nr, nc = -(-rows // br), -(-cols // bc)
    q = torch.empty(w.shape, dtype=torch.float8_e4m3fn)
    s = torch.empty((nr, nc), dtype=torch.float32)
    for i in range(nr):
        for j in range(nc):
            blk = w[i * br:(i + 1) * br, j * bc:(j + 1) * bc]
            amax = float(blk.abs().max())
            scale = amax / E4M3_MAX if amax > 0 else 1.0
            s[i, j] = scale
            q[i * br:(i + 1) * br, j * bc:(j + 1) * bc] = (blk / s[i, j]).to(torch.float8_e4m3fn)
    return q, s


def dequantize(q, s, block):
    """The meaning of a stored FP8 weight: e4m3 (exact in f32) times its block's scale_inv."""
    br, bc = block
    full = s.repeat_interleave(br, 0).repeat_interleave(bc, 1)[:q.shape[0], :q.shape[1]]
    return q.to(torch.float32) * full


def build(name, spec, out_root, scratch):
    t0 = time.time()
    block = spec["block"]
    model_type, _, model = tiny_model(spec["cfg"], SEED)
    overwrite_from_seed(model, SEED, weight)
    float_dir = os.path.join(scratch, name + "-float")
    model.save_pretrained(float_dir)
    del model

    # The FP8 checkpoint.
    sd = load_file(os.path.join(float_dir, "model.safetensors"))
    odir = os.path.join(out_root, name)
    mdir = os.path.join(odir, "model")
    shutil.rmtree(odir, ignore_errors=True)
    os.makedirs(mdir)
    fp8, partial = {}, []
    for key, t in sd.items():
        if FP8_WEIGHT.match(key):
            q, s = quantize(t.float(), block)
            fp8[key] = q
            fp8[key + "_scale_inv"] = s
            if t.shape[0] % block[0] or t.shape[1] % block[1]:
                partial.append(key)
        elif key.endswith("e_score_correction_bias"):
            fp8[key] = t.float()
        else:
            fp8[key] = t.to(torch.bfloat16)
    assert partial, f"{name}: no matrix ends in a partial block"
    save_file(fp8, os.path.join(mdir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(float_dir, "config.json")) as f:
        cfg_json = json.load(f)
    cfg_json["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                       "weight_block_size": block}
    with open(os.path.join(mdir, "config.json"), "w") as f:
        json.dump(cfg_json, f, indent=2, sort_keys=True)
    shutil.copy(os.path.join(float_dir, "generation_config.json"), mdir)

    # Read the FP8 file back and dequantize exactly what it holds.
    stored = load_file(os.path.join(mdir, "model.safetensors"))
    deq, codes = {}, []
    for key, t in stored.items():
        if key.endswith("_scale_inv"):
            continue
        if t.dtype == torch.float8_e4m3fn:
            codes.append(t.view(torch.uint8).flatten())
            deq[key] = dequantize(t, stored[key + "_scale_inv"], block)
        else:
            deq[key] = t.float()
    deq_dir = os.path.join(scratch, name + "-dequantized")
    os.makedirs(deq_dir, exist_ok=True)
    save_file(deq, os.path.join(deq_dir, "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(os.path.join(float_dir, "config.json"), deq_dir)
    model, _ = reload(deq_dir, name)

    # BOS is 0 here (the other fixtures' 1).
    ids = prompt_ids(PROMPT_LEN, VOCAB, 11, 5, 17, bos=0)
    x = torch.tensor([ids], dtype=torch.long)
    with torch.no_grad():
        logits = model(x, use_cache=False).logits[0].float().numpy()
        # An explicit mask: the prompt starts with BOS = 0, which generate() would otherwise
        # take for padding (pad_token_id 0) and mask out.
        gen = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=NEW_TOKENS, do_sample=False,
                             use_cache=True, pad_token_id=0, eos_token_id=None)
    new_ids = gen[0, PROMPT_LEN:].tolist()
    assert new_ids[0] == int(logits[-1].argmax()), f"{name}: greedy does not continue the full forward"
    write_reference(odir, ids, new_ids, logits)

    all_codes = torch.cat(codes)
    magnitude = all_codes & 0x7F
    meta = dict(
        name=name, model_type=model_type, torch=torch.__version__, transformers=transformers.__version__,
        compute_dtype="float32", attn="eager", seed=SEED, prompt_len=PROMPT_LEN, new_tokens=NEW_TOKENS,
        weight_block_size=block, logits_shape=list(logits.shape),
        matrices_with_partial_blocks=partial,
        e4m3_codes=dict(total=int(all_codes.numel()), subnormal=int(((magnitude > 0) & (magnitude < 8)).sum()),
                        zero=int((magnitude == 0).sum()), distinct=int(torch.unique(all_codes).numel())),
        logits_stats=dict(mean=float(logits.mean()), std=float(logits.std()), absmax=float(np.abs(logits).max())),
        config=cfg_json,
        files=file_digests(mdir),
        tensors=tensors_of(mdir, with_file=False),
        seconds=round(time.time() - t0, 2),
    )
    write_meta(odir, meta)
    print(f"{name}: {meta['files']['model.safetensors']['bytes']} bytes, partial blocks in {len(partial)} matrices, "
          f"codes {meta['e4m3_codes']}, greedy {new_ids}")


def e4m3_table(out_root):
    """The 256 codes as torch decodes them (float8_e4m3fn -> float32)."""
    codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn)
    codes.to(torch.float32).numpy().astype("<f4").tofile(os.path.join(out_root, "e4m3_table.f32"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/fixtures/oracles")
    ap.add_argument("--only", nargs="*", default=list(FIXTURES))
    a = ap.parse_args()
    torch.set_num_threads(1)
    os.makedirs(a.out, exist_ok=True)
    e4m3_table(a.out)
    with tempfile.TemporaryDirectory() as scratch:
        for name in a.only:
            build(name, FIXTURES[name], a.out, scratch)


if __name__ == "__main__":
    main()
