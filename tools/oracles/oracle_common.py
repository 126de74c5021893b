"""Pieces every oracle fixture generator under tools/oracles/ shares.

The generators differ in their models, their randomisation rules and what they record; what they
have in common lives here so that the fixtures come out of one recipe: the randomisation loop
(one generator, parameters then buffers in the model's registration order), building a tiny model from a config,
reloading the saved checkpoint with a check of what transformers could not read, the reference
run (an uncached forward over the prompt, the greedy continuation with the KV cache, an uncached
forward over both), transformers' cached decode, and the files written (logits.f32,
hidden_states.npy, input_ids.json, meta.json with the digests of the model files).

The generators are run as scripts (`python tools/oracles/make_X.py`); each puts this directory on
sys.path itself, so the import works from any working directory, even where Python leaves the
script's directory off the path (-P, -I, PYTHONSAFEPATH).
"""
import argparse
import hashlib
import json
import os

import numpy as np
import torch
import transformers
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM


def prompt_ids(n, vocab, a, b, c, bos):
    """A fixed, non-repeating-looking id sequence (a*i*i + b*i + c) mod vocab, starting with `bos`."""
    ids = [(a * i * i + b * i + c) % vocab for i in range(n)]
    ids[0] = bos
    return ids


def overwrite_from_seed(model, seed, value, buffers=True):
    """Overwrites every floating parameter (and, with `buffers`, every floating buffer) from one
    generator seeded with `seed`, in named_parameters() then named_buffers() order; rotary tables
    (inv_freq) are left alone.
    Each tensor draws N(0,1) noise of its shape (f32) whether or not it is overwritten, so the
    values of the others do not depend on which ones are kept; `value(name, tensor, noise)` gives
    the new value, or None to keep the library's initialisation. Returns the generator, for draws
    that follow."""
    g = torch.Generator().manual_seed(seed)
    named = list(model.named_parameters()) + (list(model.named_buffers()) if buffers else [])
    with torch.no_grad():
        for name, p in named:
            if not torch.is_floating_point(p) or "inv_freq" in name or "rotary" in name:
                continue
            v = value(name, p, torch.randn(p.shape, generator=g, dtype=torch.float32))
            if v is not None:
                p.copy_(v.to(p.dtype))
    return g


def tiny_model(spec_config, seed):
    """A float32, eager-attention model from a variant's config dict (`model_type` plus the
    config's fields), created after seeding torch's global generator with `seed` (the library's
    initialisation of anything a randomisation keeps comes from it). Returns (model_type,
    config, model)."""
    kwargs = dict(spec_config)
    model_type = kwargs.pop("model_type")
    config = AutoConfig.for_model(model_type, **kwargs)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="eager")
    return model_type, config, model


def reload(mdir, name, tolerate_unexpected=False):
    """The checkpoint in `mdir` read back by transformers (float32, eager), so that the reference
    comes from exactly the bytes on disk. Missing or mismatched keys fail, and so do unexpected
    ones unless `tolerate_unexpected` (the caller then checks them from the loading info).
    Returns (model in eval mode, loading info)."""
    model, info = AutoModelForCausalLM.from_pretrained(mdir, dtype=torch.float32, attn_implementation="eager",
                                                       output_loading_info=True)
    checked = ("missing_keys", "mismatched_keys") + (() if tolerate_unexpected else ("unexpected_keys",))
    problems = {k: v for k, v in info.items() if v and k in checked}
    assert not problems, f"{name}: the saved checkpoint does not reload cleanly: {problems}"
    model.eval()
    return model, info


def reload_with(mdir, overrides):
    """The checkpoint in `mdir` reloaded (float32, eager) with `overrides` set on its config."""
    cfg = AutoConfig.from_pretrained(mdir)
    for k, v in overrides.items():
        setattr(cfg, k, v)
    other = AutoModelForCausalLM.from_pretrained(mdir, config=cfg, dtype=torch.float32, attn_implementation="eager")
    other.eval()
    return other


def rel_diff(a, ref):
    """max|a - ref| / max|ref|: the distance the fixtures report between two sets of logits."""
    return float(np.abs(a - ref).max() / np.abs(ref).max())


def contrast_of(mdir, overrides, x, logits, min_contrast):
    """How far the logits of the same bytes move with `overrides` (a feature the fixture is
    about switched off); at least `min_contrast`, or an engine ignoring the feature could pass."""
    with torch.no_grad():
        alt = reload_with(mdir, overrides)(x, use_cache=False).logits[0].float().numpy()
    rel = rel_diff(alt, logits)
    assert rel >= min_contrast, f"contrast {overrides}: {rel} below {min_contrast}"
    return dict(overrides=overrides, logits_rel_diff=rel)


def zero_bias_logits(model, x):
    """The logits of `x` with every router e_score_correction_bias zeroed (restored after)."""
    saved = []
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                saved.append((b, b.clone()))
                b.zero_()
        alt = model(x, use_cache=False).logits[0].float().numpy()
        for b, v in saved:
            b.copy_(v)
    return alt


def forward_watching_routers(model, x, watch, biased_only=False):
    """One uncached forward over `x` with the forward hook `watch` on every layer's router
    (`layer.mlp.gate`; with `biased_only`, the routers with an e_score_correction_bias), removed
    after."""
    hooks = []
    for layer in model.model.layers:
        gate = getattr(layer.mlp, "gate", None)
        if gate is not None and (not biased_only or hasattr(gate, "e_score_correction_bias")):
            hooks.append(gate.register_forward_hook(watch))
    with torch.no_grad():
        model(x, use_cache=False)
    for h in hooks:
        h.remove()


class Reference:
    """What `reference_run` computed: the prompt tensor `x`, the prompt's `logits` [T, vocab] and
    `hidden` states [layers + 1, T, hidden], the greedy `new_ids`, the uncached `full` forward's
    logits over prompt + continuation and their `argmax_full` at the continuation's positions,
    and (if asked) the cached decode's `step_logits`, one row per generated token."""

    def __init__(self, **fields):
        self.__dict__.update(fields)


def reference_run(model, name, ids, new_tokens, remove_after_forward=(), step_logits=False, strict=True):
    """One uncached forward over the prompt (logits of every position, hidden states of every
    layer), greedy generation of `new_tokens` with the KV cache, and one uncached forward over
    prompt + continuation; `strict`: the cached greedy must be that forward's argmax. The hooks in
    `remove_after_forward` only watch the first forward; `step_logits` keeps the logits of each
    generated step."""
    x = torch.tensor([ids], dtype=torch.long)
    more = dict(output_logits=True, return_dict_in_generate=True) if step_logits else {}
    with torch.no_grad():
        out = model(x, output_hidden_states=True, use_cache=False)
        for h in remove_after_forward:
            h.remove()
        logits = out.logits[0].float().numpy()
        hidden = torch.stack([h[0] for h in out.hidden_states]).float().numpy()
        gen = model.generate(x, max_new_tokens=new_tokens, do_sample=False, use_cache=True,
                             pad_token_id=0, eos_token_id=None, **more)
        seq = gen.sequences if step_logits else gen
        new_ids = seq[0, len(ids):].tolist()
        steps = torch.stack([l[0] for l in gen.logits]).float().numpy() if step_logits else None
        full = model(seq, use_cache=False).logits[0].float().numpy()
    argmax_full = full[len(ids) - 1:-1].argmax(-1).tolist()
    assert not strict or new_ids == argmax_full, f"{name}: cached greedy {new_ids} != uncached argmax {argmax_full}"
    return Reference(x=x, logits=logits, hidden=hidden, new_ids=new_ids, full=full, argmax_full=argmax_full,
                     step_logits=steps)


def cached_decode(model, x, d, prefill):
    """transformers' cached path: a d-token prefill with use_cache, then the rest of the prompt
    one token at a time through the cache. Returns the logits of positions d-1 .. T-1 and their
    rel_diff from the uncached prefill's."""
    with torch.no_grad():
        out = model(x[:, :d], use_cache=True)
        cache = getattr(out, "cache", None) or out.past_key_values
        rows = [out.logits[0, -1]]
        for i in range(d, x.shape[1]):
            out = model(x[:, i:i + 1], cache=cache, use_cache=True)
            cache = getattr(out, "cache", None) or out.past_key_values
            rows.append(out.logits[0, -1])
    dec = torch.stack(rows).float().numpy()
    return dec, rel_diff(dec, prefill[d - 1:])


def write_f32(path, array):
    """Raw little-endian f32, no header."""
    array.astype("<f4").tofile(path)


def write_reference(vdir, ids, new_ids, logits, hidden=None, **more_ids):
    """logits.f32, hidden_states.npy (when given) and input_ids.json ({"prompt_ids",
    "greedy_new_ids"} and `more_ids`) into the fixture directory `vdir`."""
    write_f32(os.path.join(vdir, "logits.f32"), logits)
    if hidden is not None:
        np.save(os.path.join(vdir, "hidden_states.npy"), hidden.astype("<f4"))
    with open(os.path.join(vdir, "input_ids.json"), "w") as f:
        json.dump(dict(prompt_ids=ids, greedy_new_ids=new_ids, **more_ids), f)


def write_meta(vdir, meta):
    with open(os.path.join(vdir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)


def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def file_digests(mdir):
    """Every file of the model directory: size and sha256, by name."""
    return {fn: dict(bytes=os.path.getsize(os.path.join(mdir, fn)), sha256=sha256_of(os.path.join(mdir, fn)))
            for fn in sorted(os.listdir(mdir))}


def output_digests(vdir, names):
    return {fn: sha256_of(os.path.join(vdir, fn)) for fn in names}


def digests_meta(vdir, mdir, outputs):
    """meta.json's `files` (model files: size, sha256), `outputs` (sha256 of the fixture files
    named) and `tensors` (names, shapes, dtypes, file), in that order."""
    return dict(files=file_digests(mdir), outputs=output_digests(vdir, outputs), tensors=tensors_of(mdir))


def tensors_of(model_dir, with_file=True):
    """Tensor name -> shape and stored dtype (and, `with_file`, the file holding it), read back
    from the safetensors headers of the model directory."""
    out = {}
    for fn in sorted(os.listdir(model_dir)):
        if not fn.endswith(".safetensors"):
            continue
        with safe_open(os.path.join(model_dir, fn), "pt") as f:
            for key in f.keys():
                s = f.get_slice(key)
                out[key] = dict(shape=list(s.get_shape()), dtype=s.get_dtype())
                if with_file:
                    out[key]["file"] = fn
    return out


def run_variants(doc, variants, build):
    """The command line of the generators with named variants: --out DIR [--only NAME ...];
    the fixtures are pinned to transformers 5.24.0 and computed on one thread."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", nargs="*", default=list(variants), choices=list(variants))
    args = ap.parse_args()
    assert transformers.__version__ == "5.24.0", f"fixtures are pinned to transformers 5.24.0, found {transformers.__version__}"
    torch.set_num_threads(1)
    for name in args.only:
        build(name, variants[name], args.out)
