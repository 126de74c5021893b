"""Tiny gpt-oss oracle fixtures (transformers 5.24.0, CPU, f32 compute, eager attention).

Modelled on ../shared/oracles/scripts/make_model_oracles.py (same files, same prompt recipe),
for `GptOssForCausalLM`: 4 layers alternating sliding (window 8) and full attention, 4 query and
2 KV heads of 16, 8 experts top-2 of width 32, YaRN factor 4 over 32 original positions (so
most frequencies are interpolated and the attention factor is 1.139), non-zero sinks and biases,
and a SwiGLU limit of 1.2 so the clamps bind. The prompt has 24 tokens (three windows).

Fixtures written under --out:
  gpt_oss_f32/     float32 safetensors
  gpt_oss_bf16/    bfloat16 safetensors (logits of the bf16 weights computed in f32)
  gpt_oss_mxfp4/   the f32 model with its experts quantized to MXFP4 and stored as the released
                   checkpoints do (`*_blocks` + `*_scales`, `quantization_config.quant_method =
                   mxfp4`); its reference logits come from transformers running the dequantized
                   weights in f32 (the MXFP4 values are exact in f32, so this is what any exact
                   reader must produce). The blocks/scales are written by this script, and
                   checked: transformers' own MXFP4 loader (Mxfp4Config(dequantize=True)) reads
                   them back as the same model (meta.json: transformers_mxfp4_loader_rel_diff).

Each: model/ (config.json, generation_config.json, model.safetensors), input_ids.json (prompt,
greedy continuation decoded with the KV cache), logits.f32 (prompt × vocab), hidden_states.npy,
decode_logits.f32 (the cached decode's logits for each generated step), meta.json.

Usage: /work/pyenv/venv/bin/python tools/oracles/make_gptoss_oracles.py --out tests/fixtures/oracles
"""
import argparse
import json
import os
import sys

import numpy as np
import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, GptOssConfig

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # oracle_common.py, from any working directory
from oracle_common import (file_digests, overwrite_from_seed, prompt_ids, reference_run, reload,  # noqa: E402
                           tensors_of, write_f32, write_meta, write_reference)

VOCAB = 512
SEED = 1234
PROMPT_LEN = 24
NEW_TOKENS = 8

CONFIG = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=32, num_hidden_layers=4,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=8,
              num_experts_per_tok=2, sliding_window=8,
              layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
              max_position_embeddings=512, rms_norm_eps=1e-5, swiglu_limit=1.2,
              rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0, "beta_fast": 32.0,
                               "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 32},
              tie_word_embeddings=False, attention_bias=True, bos_token_id=1, eos_token_id=2, pad_token_id=0)

# e2m1 values by code (sign bit 3).
FP4 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def randomise_(model, seed):
    """Deterministic, well-scaled values for the parameters (not the buffers): matrices ~
    1/sqrt(fan-in), biases and sinks != 0."""
    h = model.config.hidden_size
    inter = model.config.intermediate_size

    def weight(name, p, noise):
        if name.endswith("experts.gate_up_proj"):
            return noise / h ** 0.5
        if name.endswith("experts.down_proj"):
            return noise / inter ** 0.5
        if name.endswith("_bias") or name.endswith(".bias"):
            return (0.5 if "router" in name else 0.1) * noise
        if name.endswith("sinks"):
            return noise
        if "norm" in name:
            return 1.0 + 0.1 * noise
        if "embed_tokens" in name:
            return 0.5 * noise
        return noise / p.shape[-1] ** 0.5

    overwrite_from_seed(model, seed, weight, buffers=False)


def quantize_mxfp4(w):
    """w [..., rows, cols] (cols % 32 == 0) -> (blocks uint8 [..., rows, cols/32, 16], scales uint8
    [..., rows, cols/32], dequantized f32 like w). Scale: the smallest power of two with
    amax/scale <= 6; codes: nearest e2m1 (ties to the lower code index)."""
    *lead, rows, cols = w.shape
    x = w.reshape(*lead, rows, cols // 32, 32).float()
    amax = x.abs().amax(-1, keepdim=True).clamp(min=2.0 ** -126)
    e = torch.ceil(torch.log2(amax / 6.0)).clamp(-127, 127)
    scaled = x / torch.pow(2.0, e)
    codes = (scaled.unsqueeze(-1) - FP4).abs().argmin(-1).to(torch.uint8)
    deq = FP4[codes.long()] * torch.pow(2.0, e)
    blocks = (codes[..., 0::2] | (codes[..., 1::2] << 4)).to(torch.uint8)
    scales = (e.squeeze(-1) + 127).to(torch.uint8)
    return blocks, scales, deq.reshape(*lead, rows, cols)


def write(odir, name, mdir, model, ids, extra):
    # The greedy continuation's agreement with the full forward is recorded, not required.
    ref = reference_run(model, name, ids, NEW_TOKENS, step_logits=True, strict=False)
    logits, hs, new_ids, decode, full, argmax_full = (ref.logits, ref.hidden, ref.new_ids, ref.step_logits, ref.full,
                                                      ref.argmax_full)
    write_reference(odir, ids, new_ids, logits, hs, argmax_of_full_forward=argmax_full)
    write_f32(os.path.join(odir, "decode_logits.f32"), decode)
    rel = float(np.abs(decode - full[PROMPT_LEN - 1:-1]).max() / np.abs(full).max())
    meta = dict(arch="gpt_oss", model_type="gpt_oss", torch=torch.__version__, transformers=transformers.__version__,
                compute_dtype="float32", attn="eager", seed=SEED, prompt_len=PROMPT_LEN, new_tokens=NEW_TOKENS,
                generator="tools/oracles/make_gptoss_oracles.py", config=CONFIG,
                logits_shape=list(logits.shape), hidden_states_shape=list(hs.shape),
                greedy_matches_full_forward_argmax=(new_ids == argmax_full),
                decode=dict(rows=len(new_ids), rel_diff_vs_full_forward=rel),
                logits_stats=dict(mean=float(logits.mean()), std=float(logits.std()), absmax=float(np.abs(logits).max())),
                files=file_digests(mdir), tensors=tensors_of(mdir, with_file=False), **extra)
    write_meta(odir, meta)
    print(f"{name}: greedy={new_ids} consistent={meta['greedy_matches_full_forward_argmax']} decode-vs-full={rel:.2e} "
          f"absmax={meta['logits_stats']['absmax']:.3f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/fixtures/oracles")
    a = ap.parse_args()
    torch.set_num_threads(1)
    ids = prompt_ids(PROMPT_LEN, VOCAB, 7, 13, 3, bos=1)

    config = GptOssConfig(**CONFIG)
    config._attn_implementation = "eager"
    torch.manual_seed(SEED)
    base = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    randomise_(base, SEED)
    base.eval()

    for name, dtype in [("gpt_oss_f32", torch.float32), ("gpt_oss_bf16", torch.bfloat16)]:
        odir = os.path.join(a.out, name)
        mdir = os.path.join(odir, "model")
        os.makedirs(mdir, exist_ok=True)
        m = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        m.load_state_dict(base.state_dict())
        m.to(dtype).save_pretrained(mdir)
        write(odir, name, mdir, reload(mdir, name)[0], ids, dict(storage_dtype=str(dtype).replace("torch.", "")))

    # MXFP4: quantize the f32 experts, run transformers on the dequantized values, store blocks/scales.
    name = "gpt_oss_mxfp4"
    odir = os.path.join(a.out, name)
    mdir = os.path.join(odir, "model")
    os.makedirs(mdir, exist_ok=True)
    m = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    m.load_state_dict(base.state_dict())
    packed = {}
    with torch.no_grad():
        for l, layer in enumerate(m.model.layers):
            ex = layer.mlp.experts
            # The checkpoint's layout is [E, out, in]: the module's parameters transposed.
            for proj in ("gate_up_proj", "down_proj"):
                p = getattr(ex, proj)
                blocks, scales, deq = quantize_mxfp4(p.data.transpose(1, 2).contiguous())
                p.copy_(deq.transpose(1, 2))
                packed[f"model.layers.{l}.mlp.experts.{proj}_blocks"] = blocks.contiguous()
                packed[f"model.layers.{l}.mlp.experts.{proj}_scales"] = scales.contiguous()
    m.save_pretrained(mdir)
    path = os.path.join(mdir, "model.safetensors")
    sd = load_file(path)
    sd = {k: v for k, v in sd.items() if not (k.endswith("experts.gate_up_proj") or k.endswith("experts.down_proj"))}
    sd.update(packed)
    save_file(sd, path, metadata={"format": "pt"})
    with open(os.path.join(mdir, "config.json")) as f:
        cj = json.load(f)
    cj["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    with open(os.path.join(mdir, "config.json"), "w") as f:
        json.dump(cj, f, indent=2)
    scales_used = sorted({int(s) for k, v in packed.items() if k.endswith("_scales") for s in v.flatten().tolist()})
    m.eval()
    # transformers' own MXFP4 loader (dequantize=True on CPU) must read these blocks and scales
    # as the same weights: its logits against the dequantized model's.
    from transformers import Mxfp4Config
    hf = AutoModelForCausalLM.from_pretrained(mdir, dtype=torch.float32, attn_implementation="eager",
                                              quantization_config=Mxfp4Config(dequantize=True)).eval()
    with torch.no_grad():
        x = torch.tensor([ids])
        a, b = hf(x).logits[0].float().numpy(), m(x).logits[0].float().numpy()
    loader_rel = float(np.abs(a - b).max() / np.abs(b).max())
    assert loader_rel < 2e-5, loader_rel
    write(odir, name, mdir, m, ids, dict(storage_dtype="mxfp4 experts, float32 elsewhere",
                                         reference="transformers on the dequantized experts (f32)",
                                         transformers_mxfp4_loader_rel_diff=loader_rel,
                                         e8m0_scales_used=scales_used))


if __name__ == "__main__":
    main()
