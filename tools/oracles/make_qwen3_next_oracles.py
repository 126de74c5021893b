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
import argparse
import hashlib
import json
import os
import time

import numpy as np
import torch
import transformers
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.models.qwen3_next import modeling_qwen3_next as qn

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
    g = torch.Generator().manual_seed(seed)
    centred = set()
    for mname, m in model.named_modules():
        if isinstance(m, qn.Qwen3NextRMSNorm):
            centred.add(mname + ".weight")
    with torch.no_grad():
        for name, p in list(model.named_parameters()) + list(model.named_buffers()):
            if not torch.is_floating_point(p) or "inv_freq" in name or "rotary" in name:
                continue
            v = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if name in centred:
                v = 0.1 * v
            elif name.endswith("A_log"):
                v = -1.0 + 0.5 * v
            elif name.endswith("dt_bias"):
                v = 0.5 * v
            elif name.endswith(".bias"):
                v = 0.1 * v
            elif p.dim() == 1 or "norm" in name:
                v = 1.0 + 0.1 * v
            elif "embed_tokens" in name:
                v = 0.5 * v
            else:
                v = v / (p.shape[-1] ** 0.5)
            p.copy_(v.to(p.dtype))


def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def tensors_of(model_dir):
    out = {}
    for fn in sorted(os.listdir(model_dir)):
        if fn.endswith(".safetensors"):
            with safe_open(os.path.join(model_dir, fn), "pt") as f:
                for key in f.keys():
                    s = f.get_slice(key)
                    out[key] = dict(shape=list(s.get_shape()), dtype=s.get_dtype(), file=fn)
    return out


def router_gap(model, x):
    """Smallest gap over the prompt between the k-th and (k+1)-th routing probability."""
    gaps, hooks = [], []

    def watch(module, inputs, _out):
        p = torch.softmax(inputs[0].reshape(-1, module.hidden_dim).float() @ module.weight.float().T, -1)
        top = p.sort(-1, descending=True).values
        gaps.append(float((top[:, module.top_k - 1] - top[:, module.top_k]).min()))

    for layer in model.model.layers:
        gate = getattr(layer.mlp, "gate", None)
        if gate is not None:
            hooks.append(gate.register_forward_hook(watch))
    with torch.no_grad():
        model(x, use_cache=False)
    for h in hooks:
        h.remove()
    return min(gaps)


def contrast_of(mdir, overrides, x, logits):
    cfg = AutoConfig.from_pretrained(mdir)
    for k, v in overrides.items():
        setattr(cfg, k, v)
    other = AutoModelForCausalLM.from_pretrained(mdir, config=cfg, dtype=torch.float32, attn_implementation="eager")
    other.eval()
    with torch.no_grad():
        alt = other(x, use_cache=False).logits[0].float().numpy()
    rel = float(np.abs(alt - logits).max() / np.abs(logits).max())
    assert rel >= MIN_CONTRAST, f"contrast {overrides}: {rel} below {MIN_CONTRAST}"
    return dict(overrides=overrides, logits_rel_diff=rel)


def cached_decode(model, x, d, prefill):
    with torch.no_grad():
        out = model(x[:, :d], use_cache=True)
        cache = getattr(out, "cache", None) or out.past_key_values
        rows = [out.logits[0, -1]]
        for i in range(d, x.shape[1]):
            out = model(x[:, i:i + 1], cache=cache, use_cache=True)
            cache = getattr(out, "cache", None) or out.past_key_values
            rows.append(out.logits[0, -1])
    dec = torch.stack(rows).float().numpy()
    ref = prefill[d - 1:]
    return dec, float(np.abs(dec - ref).max() / np.abs(ref).max())


def build(name, spec, out_root):
    started = time.time()
    kwargs = dict(spec["config"])
    model_type = kwargs.pop("model_type")
    storage = dict(float32=torch.float32, bfloat16=torch.bfloat16)[spec["dtype"]]
    config = AutoConfig.for_model(model_type, **kwargs)
    torch.manual_seed(SEED)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="eager")
    randomise(model, SEED)
    vdir = os.path.join(out_root, name)
    mdir = os.path.join(vdir, "model")
    os.makedirs(mdir, exist_ok=True)
    model.to(storage)
    model.save_pretrained(mdir)
    del model

    model, info = AutoModelForCausalLM.from_pretrained(mdir, dtype=torch.float32, attn_implementation="eager",
                                                       output_loading_info=True)
    problems = {k: v for k, v in info.items() if v and k in ("missing_keys", "mismatched_keys", "unexpected_keys")}
    assert not problems, f"{name}: the saved checkpoint does not reload cleanly: {problems}"
    model.eval()
    types = model.config.layer_types
    assert "linear_attention" in types and "full_attention" in types, types

    n = spec["prompt_len"]
    ids = [(13 * i * i + 7 * i + 5) % VOCAB for i in range(n)]
    ids[0] = 1
    x = torch.tensor([ids], dtype=torch.long)
    with torch.no_grad():
        out = model(x, output_hidden_states=True, use_cache=False)
        logits = out.logits[0].float().numpy()
        hidden = torch.stack([h[0] for h in out.hidden_states]).float().numpy()
        gen = model.generate(x, max_new_tokens=NEW_TOKENS, do_sample=False, use_cache=True,
                             pad_token_id=0, eos_token_id=None)
        new_ids = gen[0, n:].tolist()
        full = model(gen, use_cache=False).logits[0].float().numpy()
    argmax_full = full[n - 1:-1].argmax(-1).tolist()
    assert new_ids == argmax_full, f"{name}: cached greedy {new_ids} != uncached argmax {argmax_full}"
    dec, dec_rel = cached_decode(model, x, spec["decode_from"], logits)
    gap = router_gap(model, x)
    contrasts = {k: contrast_of(mdir, v, x, logits) for k, v in spec.get("contrasts", {}).items()}

    logits.astype("<f4").tofile(os.path.join(vdir, "logits.f32"))
    dec.astype("<f4").tofile(os.path.join(vdir, "decode_logits.f32"))
    np.save(os.path.join(vdir, "hidden_states.npy"), hidden.astype("<f4"))
    with open(os.path.join(vdir, "input_ids.json"), "w") as f:
        json.dump(dict(prompt_ids=ids, greedy_new_ids=new_ids), f)
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
        files={fn: dict(bytes=os.path.getsize(os.path.join(mdir, fn)), sha256=sha256_of(os.path.join(mdir, fn)))
               for fn in sorted(os.listdir(mdir))},
        outputs={fn: sha256_of(os.path.join(vdir, fn))
                 for fn in ("logits.f32", "decode_logits.f32", "hidden_states.npy", "input_ids.json")},
        tensors=tensors_of(mdir),
        seconds=round(time.time() - started, 2),
    )
    with open(os.path.join(vdir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(f"{name}: params={meta['n_params']} tensors={len(meta['tensors'])} T={n} greedy={new_ids} "
          f"gap={gap:.3g} decode_rel={dec_rel:.2e} "
          f"contrasts={ {k: round(v['logits_rel_diff'], 4) for k, v in contrasts.items()} } {meta['seconds']}s")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    args = ap.parse_args()
    assert transformers.__version__ == "5.24.0", f"fixtures are pinned to transformers 5.24.0, found {transformers.__version__}"
    torch.set_num_threads(1)
    for name in args.only:
        build(name, VARIANTS[name], args.out)


if __name__ == "__main__":
    main()
