"""The Qwen3-MoE half of waste_to_gguf.py: a waste container (docs/CONTAINER.md) of a
Qwen3MoeForCausalLM written as a GGUF of llama.cpp's `qwen3moe` architecture, the same numbers
re-laid, so that llama.cpp (and, after a requantization, ramvamp) compute the model waste
streams. Called by waste_to_gguf.py when its source is a container; not a script on its own.

Tensor by tensor (the types as in waste_to_gguf.py: Q8B32 -> Q8_0 byte for byte, Q4B32 -> Q4_0
re-nibbled, F32 copied):
  model.embed_tokens.weight            token_embd.weight
  lm_head.weight                       output.weight (absent when tied: llama.cpp then uses
                                       token_embd.weight, as waste does)
  model.norm.weight                    output_norm.weight
  p.input_layernorm / post_attention_layernorm     blk.l.attn_norm / ffn_norm
  p.self_attn.{q,k,v,o}_proj           blk.l.attn_q / attn_k / attn_v / attn_output
  p.self_attn.{q,k}_norm               blk.l.attn_q_norm / attn_k_norm
  p.mlp.gate.weight (router, Q8B32)    blk.l.ffn_gate_inp.weight as F32: level x scale is exact
                                       in f32 (an 8-bit integer times a binary16), and F32 is
                                       the one router type ramvamp accepts
  experts-LLL.bank records             blk.l.ffn_{gate,up,down}_exps: the E records' gate, up
                                       and down matrices stacked, numpy shape (E, I, H) for gate
                                       and up and (E, H, I) for down (ggml ne {H, I, E} and
                                       {I, H, E}), expert e at index e.
No row permutation: llama.cpp rotates qwen3moe with NEOX RoPE (pairs i and i + d/2, like
transformers), listed with the NEOX architectures in llama-model.cpp's rope-type switch, and
its converter passes Qwen3-MoE's q/k rows through unchanged.
llama.cpp's qwen3moe graph always renormalizes the top-k routing weights (norm_w = true), so a
config with norm_topk_prob false is refused; so are shared experts, dense (mlp_only) layers and
a decoder_sparse_step other than 1, which the qwen3moe graph does not have.

The vocabulary. A random model has no tokenizer, but comparing engines token by token needs a
prompt every engine turns into the same ids. So each id gets a one-character piece: ids 0..255
are the byte tokens <0x00>..<0xFF>, the config's BOS/EOS and Qwen's three special ids
(151643 <|endoftext|>, 151644 <|im_start|>, 151645 <|im_end|>) are control tokens, and every
other id i is the single code point U+10000 + i. A prompt written as those characters tokenizes
to exactly those ids under llama.cpp's SentencePiece tokenizer (no merges exist, no space prefix,
no BOS added) and under the Hugging Face BPE tokenizer.json that --tokenizer-dir writes for
ramvamp; `ids_to_text` / `text_to_ids` convert.
"""
import json
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as GT

import waste_to_gguf as dense

BASE = 0x10000
QWEN_SPECIAL = {151643: "<|endoftext|>", 151644: "<|im_start|>", 151645: "<|im_end|>"}


def piece(i, specials):
    if i < 256:
        return f"<0x{i:02X}>"
    if i in specials:
        return specials[i]
    return chr(BASE + i)


def ids_to_text(ids):
    for i in ids:
        if i < 256 or i in QWEN_SPECIAL:
            sys.exit(f"token id {i}: prompt ids must be 256 or above and not a special id")
    return "".join(chr(BASE + i) for i in ids)


def text_to_ids(data, n_vocab):
    """Bytes an engine printed -> ids: a code point U+10000 + i is id i, any other byte is the
    byte token of that value (what a byte token prints)."""
    out, k = [], 0
    while k < len(data):
        b = data[k]
        if b >= 0xF0 and k + 4 <= len(data):
            try:
                cp = ord(data[k:k + 4].decode("utf-8"))
            except (UnicodeDecodeError, TypeError):
                cp = -1
            if BASE + 256 <= cp < BASE + n_vocab:
                out.append(cp - BASE)
                k += 4
                continue
        out.append(b)
        k += 1
    return out


def specials_of(cfg):
    s = dict(QWEN_SPECIAL)
    for key, name in (("bos_token_id", "<s>"), ("eos_token_id", "</s>")):
        v = cfg.get(key)
        for i in (v if isinstance(v, list) else [v]):
            if isinstance(i, int) and i not in s:
                s[i] = name if i not in s.values() else f"<special{i}>"
    return s


def add_char_vocab(w, cfg):
    n_vocab = cfg["vocab_size"]
    specials = specials_of(cfg)
    tokens, types = [], []
    for i in range(n_vocab):
        tokens.append(piece(i, specials))
        types.append(gguf.TokenType.BYTE if i < 256 else
                     gguf.TokenType.CONTROL if i in specials else gguf.TokenType.NORMAL)
    eos = cfg.get("eos_token_id", 151645)
    eos = eos[0] if isinstance(eos, list) else eos
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * n_vocab)
    w.add_token_types(types)
    w.add_bos_token_id(cfg.get("bos_token_id", 151643))
    w.add_eos_token_id(eos)
    w.add_unk_token_id(0)
    w.add_add_bos_token(False)
    w.add_add_space_prefix(False)


def write_hf_tokenizer(cfg, out_dir):
    """tokenizer.json (a BPE with one-character pieces and no merges), tokenizer_config.json and
    generation_config.json, for ramvamp-repack install --tokenizer-dir. ramvamp checks that
    <|endoftext|>, <|im_start|>, <|im_end|> are 151643..151645 and that the stop set is
    {151643, 151645}; the chat template is a stand-in (only `chat` and `serve` use it)."""
    n_vocab = cfg["vocab_size"]
    if n_vocab <= 151645:
        sys.exit(f"vocab_size {n_vocab}: ramvamp's tokenizer needs Qwen's special ids 151643..151645")
    os.makedirs(out_dir, exist_ok=True)
    vocab = {piece(i, QWEN_SPECIAL): i for i in range(n_vocab)}
    added = [{"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, s in sorted(QWEN_SPECIAL.items())]
    tok = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
           "normalizer": None, "pre_tokenizer": None, "post_processor": None,
           # byte tokens print as their byte and pieces are joined without spaces, as llama.cpp prints them
           "decoder": {"type": "Sequence", "decoders": [{"type": "ByteFallback"}, {"type": "Fuse"}]},
           "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                     "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                     "ignore_merges": False, "vocab": vocab, "merges": []}}
    with open(os.path.join(out_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False)
    template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"add_bos_token": False, "chat_template": template, "eos_token": "<|im_end|>"}, f)
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": [151645, 151643], "temperature": 1.0, "top_p": 1.0, "top_k": 0}, f)


def refuse_unsupported(cfg, where):
    if cfg.get("architectures", [None])[0] != "Qwen3MoeForCausalLM":
        sys.exit(f"{where}: architecture {cfg.get('architectures')}, this script writes Qwen3MoeForCausalLM containers only")
    if not cfg.get("norm_topk_prob", False):
        sys.exit(f"{where}: norm_topk_prob false; llama.cpp's qwen3moe always renormalizes the top-k weights")
    if cfg.get("mlp_only_layers") or cfg.get("decoder_sparse_step", 1) != 1:
        sys.exit(f"{where}: dense layers (mlp_only_layers / decoder_sparse_step) are not in llama.cpp's qwen3moe")
    if cfg.get("shared_expert_intermediate_size"):
        sys.exit(f"{where}: shared experts are not in llama.cpp's qwen3moe")
    if cfg.get("use_sliding_window"):
        sys.exit(f"{where}: use_sliding_window true; llama.cpp's qwen3moe attends over the whole context")
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        sys.exit(f"{where}: RoPE type {rope.get('rope_type', rope.get('type'))!r}; this script writes plain RoPE only")


def expert_count(cfg):
    """The first of the keys docs/CONTAINER.md lists (transformers 5 writes num_local_experts)."""
    for key in ("num_local_experts", "num_experts", "n_routed_experts"):
        if cfg.get(key):
            return int(cfg[key])
    sys.exit("config: no expert count (num_local_experts / num_experts)")


def rope_theta(cfg):
    """rope_theta, or transformers 5's rope_parameters.rope_theta."""
    v = cfg.get("rope_theta", (cfg.get("rope_parameters") or {}).get("rope_theta"))
    if v is None:
        sys.exit("config: no rope_theta")
    return float(v)


TRUNK_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight",
}


def gguf_name(hf):
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
    if hf in top:
        return top[hf]
    parts = hf.split(".")
    rest = ".".join(parts[3:])
    if len(parts) < 5 or parts[:2] != ["model", "layers"] or rest not in TRUNK_NAMES:
        sys.exit(f"trunk tensor {hf}: not a Qwen3-MoE tensor this script knows")
    return f"blk.{int(parts[2])}.{TRUNK_NAMES[rest]}"


class Source:
    """A container, checked the way this script relies on it (not the engine's full check)."""

    def __init__(self, path):
        self.path = path
        with open(os.path.join(path, "manifest.json")) as f:
            self.manifest = json.load(f)
        m = self.manifest
        if m.get("format") != "waste-container" or m.get("version") != 2:
            sys.exit(f"{path}/manifest.json: not a version 2 waste container")
        self.cfg = m["config"]
        refuse_unsupported(self.cfg, f"{path}/manifest.json config")
        self.trunk = {}
        for fentry in m["trunk"]["files"]:
            name = fentry["name"]
            if "/" in name or name in (".", ".."):
                sys.exit(f"{path}/manifest.json: trunk file name {name!r}")
            tensors, _ = dense.read_safetensors(os.path.join(path, name))
            self.trunk.update(tensors)
        layers = self.cfg["num_hidden_layers"]
        self.banks = {b["layer"]: b for b in m["banks"]}
        if sorted(self.banks) != list(range(layers)):
            sys.exit(f"{path}/manifest.json: banks for layers {sorted(self.banks)}, expected 0..{layers - 1}")

    def experts(self, layer):
        """{'gate'|'up'|'down': (dtype, uint8 view (E, rows, row_bytes))} of one bank, not copied."""
        b = self.banks[layer]
        fpath = os.path.join(self.path, b["file"])
        n, rec = b["experts"], b["record_bytes"]
        if os.path.getsize(fpath) != n * rec:
            sys.exit(f"{fpath}: {os.path.getsize(fpath)} bytes, expected {n} x {rec}")
        raw = np.memmap(fpath, dtype=np.uint8, mode="r").reshape(n, rec)
        out = {}
        for mat in b["matrices"]:
            rows, cols, off, nb = mat["rows"], mat["cols"], mat["offset"], mat["bytes"]
            if off + nb > rec or nb % rows:
                sys.exit(f"{fpath}: matrix {mat['name']} at {off}+{nb} does not fit a record of {rec}")
            out[mat["name"]] = (mat["dtype"], raw[:, off:off + nb].reshape(n, rows, nb // rows), cols)
        return out


def re_lay(dtype, blocks_u8, what):
    """uint8 (..., row_bytes) of one of our types -> (uint8 (..., row_bytes) in GGML order, type)."""
    if dtype == "Q8B32":
        if blocks_u8.shape[-1] % dense.Q8_BLOCK_BYTES:
            sys.exit(f"{what}: row of {blocks_u8.shape[-1]} bytes is not whole Q8B32 blocks")
        return blocks_u8, GT.Q8_0
    if dtype == "Q4B32":
        if blocks_u8.shape[-1] % dense.Q4_BLOCK_BYTES:
            sys.exit(f"{what}: row of {blocks_u8.shape[-1]} bytes is not whole Q4B32 blocks")
        b = np.asarray(blocks_u8).reshape(blocks_u8.shape[:-1] + (-1, dense.Q4_BLOCK_BYTES))
        return dense.q4b32_to_q4_0(b).reshape(blocks_u8.shape), GT.Q4_0
    sys.exit(f"{what}: dtype {dtype}; this script transcodes Q8B32 and Q4B32 losslessly (convert with --trunk/--experts q8 or q4)")


def decode(dtype, raw, shape):
    """Our own reference decoding to f32, shape `shape`."""
    rows, cols = shape[-2], shape[-1]
    lead = tuple(shape[:-2])
    if dtype == "Q8B32":
        return dense.decode_q8b32(np.asarray(raw).reshape(lead + (rows, cols // dense.BLOCK, dense.Q8_BLOCK_BYTES)))
    if dtype == "Q4B32":
        return dense.decode_q4b32(np.asarray(raw).reshape(lead + (rows, cols // dense.BLOCK, dense.Q4_BLOCK_BYTES)))
    if dtype == "F32":
        return np.asarray(raw).view(np.float32).reshape(shape)
    sys.exit(f"no decoding for {dtype}")


def plan(src):
    """[(gguf name, thunk returning the array to write, (shape for add_tensor_info), raw type)] in
    forward order: everything is produced only when written, so a 17 GB container streams
    through in bank-sized pieces."""
    cfg, items = src.cfg, []

    def trunk_item(hf):
        dtype, shape, raw = src.trunk[hf]
        name = gguf_name(hf)
        if dtype == "F32":
            return (name, lambda: np.asarray(raw).view(np.float32).reshape(shape), shape, None)
        if len(shape) != 2:
            sys.exit(f"trunk tensor {hf}: {dtype} {shape}, expected 2 dimensions")
        if hf.endswith("mlp.gate.weight"):
            return (name, lambda: np.ascontiguousarray(decode(dtype, raw, shape)), shape, None)
        rows = shape[0]
        return (name, lambda: np.ascontiguousarray(re_lay(dtype, np.asarray(raw).reshape(rows, -1), hf)[0]),
                shape, re_lay(dtype, np.zeros((1, raw.size // rows), np.uint8), hf)[1])

    items.append(trunk_item("model.embed_tokens.weight"))
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        for rest in TRUNK_NAMES:
            if p + rest not in src.trunk:
                sys.exit(f"{src.path}: trunk tensor {p + rest} missing")
            items.append(trunk_item(p + rest))
        bank = src.experts(layer)
        for proj in ("gate", "up", "down"):
            if proj not in bank:
                sys.exit(f"{src.path}: bank of layer {layer} has no {proj} matrix")
            dtype, view, cols = bank[proj]
            what = f"layer {layer} experts {proj}"
            ggml_type = re_lay(dtype, np.zeros((1, view.shape[-1]), np.uint8), what)[1]
            shape = (view.shape[0], view.shape[1], cols)
            items.append((f"blk.{layer}.ffn_{proj}_exps.weight",
                          (lambda v=view, d=dtype, w=what: np.ascontiguousarray(re_lay(d, v, w)[0])),
                          shape, ggml_type))
    items.append(trunk_item("model.norm.weight"))
    if not cfg.get("tie_word_embeddings", False):
        if "lm_head.weight" not in src.trunk:
            sys.exit("config says untied embeddings but the trunk has no lm_head.weight")
        items.append(trunk_item("lm_head.weight"))
    return items


def write_container(src_dir, out_path):
    src = Source(src_dir)
    cfg = src.cfg
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    w = gguf.GGUFWriter(out_path, "qwen3moe")
    w.add_name(os.path.basename(os.path.normpath(src_dir)))
    w.add_context_length(cfg.get("max_position_embeddings", 40960))
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg.get("intermediate_size", cfg["moe_intermediate_size"]))
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(rope_theta(cfg))
    w.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    w.add_expert_count(expert_count(cfg))
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    w.add_vocab_size(cfg["vocab_size"])
    experts = {b["matrices"][0]["dtype"] for b in src.manifest["banks"]}
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if "Q8B32" in experts else gguf.LlamaFileType.MOSTLY_Q4_0)
    add_char_vocab(w, cfg)

    items = plan(src)
    for name, _, shape, ggml_type in items:
        if ggml_type is None:
            w.add_tensor_info(name, shape, np.dtype(np.float32), int(np.prod(shape)) * 4)
        else:
            block_bytes = dense.Q8_BLOCK_BYTES if ggml_type == GT.Q8_0 else dense.Q4_BLOCK_BYTES
            nbytes = int(np.prod(shape)) // dense.BLOCK * block_bytes
            # GGUFWriter wants the shape in elements when given a raw type with a non-uint8 dtype
            w.add_tensor_info(name, shape, np.dtype(np.float32), nbytes, raw_dtype=ggml_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, make, _, _ in items:
        w.write_tensor_data(make())
    w.close()
    return src


def check_container(out_path, src):
    """Decodes, with gguf's own dequantizer, the token embedding's first rows, layer 0's q_proj
    and router, and two experts of the last layer, and compares them with our decoding."""
    reader = gguf.GGUFReader(out_path)
    by_name = {t.name: t for t in reader.tensors}
    cfg = src.cfg
    last = cfg["num_hidden_layers"] - 1
    cases = [("model.embed_tokens.weight", 4096), ("model.layers.0.self_attn.q_proj.weight", None),
             ("model.layers.0.self_attn.k_proj.weight", None), ("model.layers.0.mlp.gate.weight", None)]
    for hf, rows in cases:
        dtype, shape, raw = src.trunk[hf]
        t = by_name[gguf_name(hf)]
        got = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).reshape(shape)
        ours = decode(dtype, raw, shape)
        if rows:
            got, ours = got[:rows], ours[:rows]
        report(gguf_name(hf), t.tensor_type.name, ours, got)
    bank = src.experts(last)
    n = bank["gate"][1].shape[0]
    for proj in ("gate", "up", "down"):
        dtype, view, cols = bank[proj]
        t = by_name[f"blk.{last}.ffn_{proj}_exps.weight"]
        data = np.asarray(t.data)
        for e in sorted({0, n - 1}):
            got = gguf.quants.dequantize(data[e], t.tensor_type)
            ours = decode(dtype, view[e], (view.shape[1], cols))
            report(f"{t.name}[{e}]", t.tensor_type.name, ours, got)


def report(name, tname, ours, got):
    same = ours.shape == got.shape and np.array_equal(ours, got)
    diff = float(np.max(np.abs(ours - got))) if ours.shape == got.shape else float("inf")
    print(f"check {name} ({tname}) shape {tuple(ours.shape)}: {'identical' if same else 'DIFFERENT'}; max |diff| {diff:g}")
    if not same:
        sys.exit(1)


def main(argv):
    """Prompt helpers for the engines' text interfaces:
    ids-to-text 300,400,...      prints the prompt characters of those ids (UTF-8, no newline)
    text-to-ids N_VOCAB          reads what an engine printed on stdin, prints the ids"""
    if len(argv) == 2 and argv[0] == "ids-to-text":
        sys.stdout.write(ids_to_text([int(x) for x in argv[1].replace(",", " ").split()]))
    elif len(argv) == 2 and argv[0] == "text-to-ids":
        print(",".join(str(i) for i in text_to_ids(sys.stdin.buffer.read(), int(argv[1]))))
    else:
        sys.exit(main.__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
