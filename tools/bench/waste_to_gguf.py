#!/usr/bin/env python3
"""Writes a dense Llama checkpoint of ours (config.json + model.safetensors, as made by
`waste random-model` or `waste quantize`) as a GGUF file that llama.cpp loads, so that
both engines can be timed on the same weights.

Tensor by tensor:
  Q4B32 -> Q4_0   lossless: both are 18 bytes per 32 weights, one binary16 scale and a 4-bit
                  level q in -8..=7 with weight = q * scale. Only the nibble order and coding
                  differ (Q4B32: weight 2k in the low nibble of byte k, weight 2k+1 in the high
                  one, two's complement; Q4_0: weight j low and weight j+16 high in byte j,
                  stored as q + 8). The scale bytes are copied as they are.
  Q8B32 -> Q8_0   lossless and byte for byte: both are a binary16 scale then 32 signed bytes
                  in position order (34 bytes per 32 weights).
  BF16  -> BF16   bytes copied.
  F32   -> F32    bytes copied (the RMSNorm weights).
The rows of q_proj and k_proj are reordered within each head: transformers rotates the two
halves of a head (i with i + head_dim/2), llama.cpp's llama graph rotates neighbours (2i with
2i + 1). A row permutation moves whole rows of blocks, so it is lossless in every type.

Extra things llama.cpp needs and our checkpoints do not have:
  - rope_freqs.weight: llama.cpp applies the llama3 RoPE scaling through per-frequency divisors,
    computed here from config.json's rope_scaling (the formula of transformers'
    _compute_llama3_parameters, written out below).
  - a vocabulary: the random model has no tokenizer, so a dummy SentencePiece-style vocabulary of
    vocab_size entries is written (256 byte tokens, placeholders, and BOS/EOS at the config's
    ids). It only serves to make the file loadable; `llama-bench` never tokenizes text.

Tied embeddings: no output.weight is written; llama.cpp then uses token_embd.weight for the
output projection, like our engine does.

Needs the `gguf` and `numpy` packages (PyPI). Nothing here is taken from llama.cpp's converter.

Containers: when CHECKPOINT_DIR is a waste container (it has manifest.json) of a
Qwen3MoeForCausalLM, the output is a llama.cpp `qwen3moe` GGUF with the experts stacked per layer
and a vocabulary of one-character pieces (see waste_moe_to_gguf.py, which does that part).

Usage: python3 tools/bench/waste_to_gguf.py CHECKPOINT_DIR OUT.gguf [--check] [--tokenizer-dir DIR]
  --check   read OUT.gguf back with gguf's reader and compare the decoded weights of the token
            embedding and of layer 0's q_proj (for a container also layer 0's k_proj and router
            and two experts of the last layer) with our own decoding of the source.
  --tokenizer-dir DIR   (containers) also write into DIR a tokenizer.json, tokenizer_config.json
            and generation_config.json with the same one-character vocabulary, for
            `ramvamp-repack install --tokenizer-dir DIR`.
"""
import json
import math
import os
import struct
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as GT

BLOCK = 32
Q4_BLOCK_BYTES = 18
Q8_BLOCK_BYTES = 34


def read_safetensors(path):
    """Returns ({name: (dtype, shape, memmap of the raw bytes)}, metadata)."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        if n > size - 8:
            sys.exit(f"{path}: header length {n} runs past the end of the file ({size} bytes)")
        header = json.loads(f.read(n))
    base = 8 + n
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    meta = header.pop("__metadata__", None) or {}
    tensors = {}
    for name, t in header.items():
        start, end = t["data_offsets"]
        if not (0 <= start <= end <= size - base):
            sys.exit(f"{path}: tensor {name}: data_offsets {start}..{end} outside the data")
        tensors[name] = (t["dtype"], t["shape"], raw[base + start : base + end])
    return tensors, meta


def q4b32_to_q4_0(blocks):
    """blocks: uint8 (..., 18) in Q4B32 -> uint8 (..., 18) in Q4_0 with the same decoded values."""
    payload = blocks[..., 2:]
    levels = np.empty(payload.shape[:-1] + (BLOCK,), dtype=np.uint8)
    levels[..., 0::2] = payload & 0x0F
    levels[..., 1::2] = payload >> 4
    # two's complement nibble n means q = (n ^ 8) - 8, so q + 8 == n ^ 8
    biased = levels ^ 8
    out = np.empty_like(blocks)
    out[..., :2] = blocks[..., :2]
    out[..., 2:] = biased[..., :16] | (biased[..., 16:] << 4)
    return out


def decode_q4b32(blocks):
    """Our own reference decoding (seed 000): f32 weights, shape (..., 32 * blocks)."""
    scale = blocks[..., :2].copy().view(np.float16).astype(np.float32)
    payload = blocks[..., 2:]
    n = np.empty(payload.shape[:-1] + (BLOCK,), dtype=np.int16)
    n[..., 0::2] = payload & 0x0F
    n[..., 1::2] = payload >> 4
    q = (n ^ 8) - 8
    w = q.astype(np.float32) * scale
    return w.reshape(w.shape[:-2] + (-1,))


def decode_q8b32(blocks):
    """Our own reference decoding (seed 000): f32 weights, shape (..., 32 * blocks)."""
    scale = blocks[..., :2].copy().view(np.float16).astype(np.float32)
    q = blocks[..., 2:].copy().view(np.int8).astype(np.float32)
    w = q * scale
    return w.reshape(w.shape[:-2] + (-1,))


def rotate_half_to_neighbours(rows, n_head):
    """Reorders the rows (axis 0) of a q/k projection from transformers' half-split RoPE pairing
    to llama.cpp's adjacent pairing: in each head, new row 2i + j is old row j * (d/2) + i."""
    total = rows.shape[0]
    d = total // n_head
    half = d // 2
    order = np.empty(total, dtype=np.int64)
    for h in range(n_head):
        for i in range(half):
            for j in range(2):
                order[h * d + 2 * i + j] = h * d + j * half + i
    return rows[order]


def llama3_freq_divisors(cfg):
    """One divisor per rotated pair: llama.cpp divides the base frequency by it."""
    rs = cfg.get("rope_scaling") or {}
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    if rs.get("rope_type", rs.get("type")) != "llama3":
        return None
    theta = float(cfg["rope_theta"])
    factor = float(rs["factor"])
    low = float(rs["low_freq_factor"])
    high = float(rs["high_freq_factor"])
    original = float(rs["original_max_position_embeddings"])
    low_wavelen = original / low
    high_wavelen = original / high
    out = []
    for i in range(0, head_dim, 2):
        freq = 1.0 / theta ** (i / head_dim)
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def gguf_name(hf):
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    if hf == "lm_head.weight":
        return "output.weight"
    parts = hf.split(".")
    if len(parts) < 5 or parts[0] != "model" or parts[1] != "layers":
        sys.exit(f"tensor {hf}: not a dense Llama tensor this script knows")
    layer, rest = parts[2], ".".join(parts[3:])
    table = {
        "input_layernorm.weight": "attn_norm.weight",
        "post_attention_layernorm.weight": "ffn_norm.weight",
        "self_attn.q_proj.weight": "attn_q.weight",
        "self_attn.k_proj.weight": "attn_k.weight",
        "self_attn.v_proj.weight": "attn_v.weight",
        "self_attn.o_proj.weight": "attn_output.weight",
        "mlp.gate_proj.weight": "ffn_gate.weight",
        "mlp.up_proj.weight": "ffn_up.weight",
        "mlp.down_proj.weight": "ffn_down.weight",
    }
    if rest not in table:
        sys.exit(f"tensor {hf}: not a dense Llama tensor this script knows")
    return f"blk.{layer}.{table[rest]}"


def convert_tensor(name, dtype, shape, raw, cfg):
    """Returns (array to write, GGML type). Q4_0/Q8_0/BF16 arrays are raw bytes (rows, bytes per row)."""
    n_head = cfg["num_attention_heads"]
    n_kv = cfg["num_key_value_heads"]
    heads = n_head if name.endswith("q_proj.weight") else n_kv if name.endswith("k_proj.weight") else None
    if dtype == "F32":
        arr = np.asarray(raw).view(np.float32).reshape(shape)
        return arr, GT.F32
    if len(shape) != 2:
        sys.exit(f"tensor {name}: {dtype} with shape {shape}, expected two dimensions")
    rows, cols = shape
    if dtype == "Q4B32":
        if cols % BLOCK or raw.size != rows * cols // BLOCK * Q4_BLOCK_BYTES:
            sys.exit(f"tensor {name}: {raw.size} bytes do not fit Q4B32 {shape}")
        blocks = np.asarray(raw).reshape(rows, cols // BLOCK, Q4_BLOCK_BYTES)
        if heads:
            blocks = rotate_half_to_neighbours(blocks, heads)
        return q4b32_to_q4_0(blocks).reshape(rows, -1), GT.Q4_0
    if dtype == "Q8B32":
        if cols % BLOCK or raw.size != rows * cols // BLOCK * Q8_BLOCK_BYTES:
            sys.exit(f"tensor {name}: {raw.size} bytes do not fit Q8B32 {shape}")
        blocks = np.asarray(raw).reshape(rows, cols // BLOCK, Q8_BLOCK_BYTES)
        if heads:
            blocks = rotate_half_to_neighbours(blocks, heads)
        return np.ascontiguousarray(blocks.reshape(rows, -1)), GT.Q8_0
    if dtype == "BF16":
        if raw.size != rows * cols * 2:
            sys.exit(f"tensor {name}: {raw.size} bytes do not fit BF16 {shape}")
        arr = np.asarray(raw).reshape(rows, cols * 2)
        if heads:
            arr = rotate_half_to_neighbours(arr, heads)
        return np.ascontiguousarray(arr), GT.BF16
    sys.exit(f"tensor {name}: dtype {dtype} not handled (Q4B32, Q8B32, BF16 or F32)")


def add_dummy_vocab(w, cfg):
    n_vocab = cfg["vocab_size"]
    bos, eos = cfg.get("bos_token_id", 1), cfg.get("eos_token_id", 2)
    if isinstance(eos, list):
        eos = eos[0]
    tokens, types = [], []
    for i in range(n_vocab):
        if i < 256:
            tokens.append(f"<0x{i:02X}>")
            types.append(gguf.TokenType.BYTE)
        elif i == bos:
            tokens.append("<s>")
            types.append(gguf.TokenType.CONTROL)
        elif i == eos:
            tokens.append("</s>")
            types.append(gguf.TokenType.CONTROL)
        else:
            tokens.append(f"<t{i}>")
            types.append(gguf.TokenType.NORMAL)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * n_vocab)
    w.add_token_types(types)
    w.add_bos_token_id(bos)
    w.add_eos_token_id(eos)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)


def write(src_dir, out_path):
    with open(os.path.join(src_dir, "config.json")) as f:
        cfg = json.load(f)
    if cfg.get("model_type") != "llama":
        sys.exit(f"{src_dir}/config.json: model_type {cfg.get('model_type')!r}, this script writes llama only")
    tensors, _ = read_safetensors(os.path.join(src_dir, "model.safetensors"))
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]

    w = gguf.GGUFWriter(out_path, "llama")
    w.add_name(os.path.basename(os.path.normpath(src_dir)))
    w.add_context_length(cfg.get("max_position_embeddings", 4096))
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(float(cfg["rope_theta"]))
    w.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    w.add_vocab_size(cfg["vocab_size"])

    kinds = {tensors[n][0] for n in tensors}
    file_type = (gguf.LlamaFileType.MOSTLY_Q4_0 if "Q4B32" in kinds else
                 gguf.LlamaFileType.MOSTLY_Q8_0 if "Q8B32" in kinds else gguf.LlamaFileType.MOSTLY_BF16)
    w.add_file_type(file_type)
    add_dummy_vocab(w, cfg)

    divisors = llama3_freq_divisors(cfg)
    if divisors is not None:
        w.add_tensor("rope_freqs.weight", divisors)
    if not cfg.get("tie_word_embeddings", False) and "lm_head.weight" not in tensors:
        sys.exit("config says untied embeddings but there is no lm_head.weight")
    for name in sorted(tensors, key=order_key):
        dtype, shape, raw = tensors[name]
        arr, ggml_type = convert_tensor(name, dtype, shape, raw, cfg)
        if ggml_type == GT.F32:
            w.add_tensor(gguf_name(name), np.ascontiguousarray(arr))
        else:
            w.add_tensor(gguf_name(name), arr, raw_dtype=ggml_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return cfg, tensors


def order_key(name):
    """Embedding, then the layers in order, then the final norm (the order of the forward pass)."""
    parts = name.split(".")
    if name.startswith("model.layers."):
        return (1, int(parts[2]), name)
    return (0 if "embed" in name else 2, 0, name)


def check(out_path, cfg, tensors):
    """Compares what llama.cpp will read (decoded by gguf's reader) with our own decoding."""
    reader = gguf.GGUFReader(out_path)
    by_name = {t.name: t for t in reader.tensors}
    n_head = cfg["num_attention_heads"]
    for hf, rows in (("model.embed_tokens.weight", 4096), ("model.layers.0.self_attn.q_proj.weight", None)):
        dtype, shape, raw = tensors[hf]
        t = by_name[gguf_name(hf)]
        got = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
        if dtype == "Q4B32":
            ours = decode_q4b32(np.asarray(raw).reshape(shape[0], shape[1] // BLOCK, Q4_BLOCK_BYTES))
        elif dtype == "Q8B32":
            ours = decode_q8b32(np.asarray(raw).reshape(shape[0], shape[1] // BLOCK, Q8_BLOCK_BYTES))
        else:
            ours = (np.asarray(raw).view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(shape)
        if "q_proj" in hf:
            ours = rotate_half_to_neighbours(ours, n_head)
        if rows:
            ours, got = ours[:rows], got[:rows]
        same = np.array_equal(ours, got)
        print(f"check {gguf_name(hf)} ({t.tensor_type.name}) rows compared {ours.shape[0]}: "
              f"{'identical' if same else 'DIFFERENT'}; max |diff| {float(np.max(np.abs(ours - got))):g}")
        if not same:
            sys.exit(1)


def main(argv):
    args = [a for a in argv if not a.startswith("--")]
    opts = [a for a in argv if a.startswith("--")]
    tok_dir = None
    if "--tokenizer-dir" in argv:
        k = argv.index("--tokenizer-dir")
        if k + 1 >= len(argv):
            sys.exit(__doc__)
        tok_dir = argv[k + 1]
        args.remove(tok_dir)
    if len(args) != 2 or any(a not in ("--check", "--tokenizer-dir") for a in opts):
        sys.exit(__doc__)
    if os.path.exists(os.path.join(args[0], "manifest.json")):
        # a container: the Qwen3-MoE transcoder (waste_moe_to_gguf.py)
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import waste_moe_to_gguf as moe
        src = moe.write_container(args[0], args[1])
        print(f"wrote {args[1]}: {os.path.getsize(args[1])} bytes from the container {args[0]}")
        if "--check" in argv:
            moe.check_container(args[1], src)
        if tok_dir:
            moe.write_hf_tokenizer(src.cfg, tok_dir)
            print(f"wrote the matching tokenizer.json, tokenizer_config.json, generation_config.json in {tok_dir}")
        return
    if tok_dir:
        sys.exit("--tokenizer-dir is for containers (the Qwen3-MoE path)")
    cfg, tensors = write(args[0], args[1])
    print(f"wrote {args[1]}: {os.path.getsize(args[1])} bytes, {len(tensors)} tensors from {args[0]}")
    if "--check" in argv:
        check(args[1], cfg, tensors)


if __name__ == "__main__":
    main(sys.argv[1:])
