#!/usr/bin/env python3
"""Small tokenizer.json files with the pipelines of each Hugging Face family, and their golden
ids from the `tokenizers` library.

The real vocabularies are megabytes; the pipeline around them (normalizer, pre-tokenizer,
model options, added tokens, post-processor, decoder) is what differs between families, so
each fixture trains a small BPE vocabulary (1,000 tokens) on a fixed corpus and wires it the
way the family's published tokenizer.json does:
  gpt2     ByteLevel(use_regex) pre-tokenizer and decoder
  smollm2  Digits(individual) + ByteLevel
  qwen2    NFC; Split(Qwen2 pattern) + ByteLevel(no regex); <|im_start|> etc. and a non-special <think>
  olmoe    NFC; ByteLevel(use_regex)
  llama3   Split(Llama 3 pattern) + ByteLevel(no regex); ignore_merges; BOS by TemplateProcessing
  llama2   Prepend/Replace ▁ normalizer; BPE with byte_fallback, fuse_unk; Replace/ByteFallback/Fuse/Strip decoder
  llama2_metaspace  Metaspace(prepend_scheme first) pre-tokenizer and decoder (newer conversions; Mixtral)

Writes tests/fixtures/tokenizers/hf/<family>.json and hf/golden.json (markup ids: added tokens
resolved; content ids: the same tokenizer with no added tokens).

Usage: /tmp/tokvenv/bin/python tools/hf_family_fixtures.py   (pip install tokenizers)
"""
import json
import os
import random
import sys

import tokenizers
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

sys.path.insert(0, os.path.dirname(__file__))
from deepseek_golden import HAND, random_texts  # noqa: E402

OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "tokenizers", "hf")
QWEN2 = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
LLAMA3 = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""


def corpus():
    texts = []
    for p in ["/usr/share/common-licenses/GPL-3", "/usr/share/common-licenses/Apache-2.0"]:
        with open(p, encoding="utf-8") as f:
            texts.append(f.read())
    texts.extend(HAND)
    texts.extend(random_texts(300, 7))
    return texts


def byte_level(pre, normalizer=None, special=(), nonspecial=(), ignore_merges=False, bos=None):
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus(), trainer)
    tok.add_special_tokens(list(special))
    tok.add_tokens(list(nonspecial))
    if bos:
        tpl = processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, tok.token_to_id(bos))])
        tok.post_processor = processors.Sequence([processors.ByteLevel(trim_offsets=False), tpl])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def sentencepiece(metaspace):
    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    if metaspace:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
        tok.decoder = decoders.Sequence([decoders.Metaspace(replacement="\u2581", prepend_scheme="first", split=False),
                                         decoders.ByteFallback(), decoders.Fuse()])
    else:
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
        tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    trainer = trainers.BpeTrainer(vocab_size=1000, special_tokens=["<unk>", "<s>", "</s>"], limit_alphabet=200, show_progress=False)
    # Train on the normalized text so merges are over ▁-words, as SentencePiece's are.
    tok.train_from_iterator(("\u2581" + t.replace(" ", "\u2581") for t in corpus()), trainer)
    doc = json.loads(tok.to_str())
    vocab = doc["model"]["vocab"]
    for b in range(256):
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    doc["model"]["byte_fallback"] = True
    tok = Tokenizer.from_str(json.dumps(doc))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    return tok


def families():
    bl = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    bl_plain = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    return {
        "gpt2": byte_level(bl, special=["<|endoftext|>"]),
        "smollm2": byte_level(pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), bl]),
                              special=["<|endoftext|>", "<|im_start|>", "<|im_end|>"]),
        "qwen2": byte_level(pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(QWEN2), "isolated"), bl_plain]),
                            normalizer=normalizers.NFC(), special=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                            nonspecial=["<think>", "</think>"]),
        "olmoe": byte_level(bl, normalizer=normalizers.NFC(), special=["<|endoftext|>", "<|padding|>"]),
        "llama3": byte_level(pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA3), "isolated"), bl_plain]),
                             special=["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"], ignore_merges=True,
                             bos="<|begin_of_text|>"),
        "llama2": sentencepiece(False),
        "llama2_metaspace": sentencepiece(True),
    }


def main():
    os.makedirs(OUT, exist_ok=True)
    texts = HAND + random_texts(40, 99) + ["<s>hello</s> <s>", "a <unk> b", "<|im_start|>user\nhi<|im_end|>", "x<think>y</think>"]
    golden = {"generator": "tools/hf_family_fixtures.py", "tokenizers_version": tokenizers.__version__, "families": {}}
    for name, tok in families().items():
        path = os.path.join(OUT, f"{name}.json")
        tok.save(path)
        doc = json.loads(open(path, encoding="utf-8").read())
        doc["added_tokens"] = []
        content = Tokenizer.from_str(json.dumps(doc))
        cases = []
        for t in texts:
            c = content.encode(t, add_special_tokens=False).ids
            cases.append({"text": t, "markup": tok.encode(t, add_special_tokens=False).ids, "content": c,
                          "decoded": content.decode(c)})
        with_bos = tok.encode("hi", add_special_tokens=True).ids
        plain = tok.encode("hi", add_special_tokens=False).ids
        bos = with_bos[0] if len(with_bos) == len(plain) + 1 else None
        golden["families"][name] = {"bos": bos, "cases": cases}
        print(name, os.path.getsize(path), "bytes; bos", bos)
    with open(os.path.join(OUT, "golden.json"), "w", encoding="utf-8") as f:
        json.dump(golden, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")


main()
