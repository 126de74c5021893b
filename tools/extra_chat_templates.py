#!/usr/bin/env python3
"""Write tests/fixtures/chat_templates_extra: more real chat templates, with jinja2 goldens.

Usage: python3 tools/extra_chat_templates.py TOKENIZER_CONFIGS_PY [--all OUT_DIR]

TOKENIZER_CONFIGS_PY is tests/python_tests/data/tokenizer_configs.py of
openvinotoolkit/openvino.genai (Apache-2.0; taken at commit
da1db864d2bc1a265e9a036f5b57ef13f0e86c2c): a dict of per-model extracts of the Hub's
tokenizer_config.json (bos/eos/pad/unk tokens and chat_template). For each model of MODELS
this writes <name>/tokenizer_config.json (a template given there as a dict of named templates
becomes the Hub's list form, [{"name", "template"}]) and <name>/golden.json, rendered by
tests/fixtures/chat_templates/make_golden.py (same cases, same rules, jinja2 >= 3.1.6).

With --all OUT_DIR, every distinct template of the file is written to OUT_DIR instead (a
one-off wider check, not committed: 150 templates, 2269 cases at the time of writing).
"""
import importlib.util
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "fixtures", "chat_templates"))
import make_golden  # noqa: E402

OUT = os.path.join(ROOT, "tests", "fixtures", "chat_templates_extra")

# Chosen for their variety (macros and call blocks, {% generation %}, role tokens assembled from
# the role, list-form named templates, tool prompts, system-message folding, raise_exception).
MODELS = [
    "01-ai/Yi-1.5-34B-Chat", "CohereLabs/aya-expanse-8b", "CohereLabs/c4ai-command-r-v01",
    "CohereLabs/c4ai-command-r7b-12-2024", "HuggingFaceH4/zephyr-7b-gemma-sft-v0.1", "LGAI-EXAONE/EXAONE-3.5-2.4B-Instruct",
    "Qwen/QwQ-32B", "Qwen/Qwen1.5-4B-Chat", "Snowflake/snowflake-arctic-instruct", "THUDM/chatglm3-6b", "THUDM/glm-4-9b-chat",
    "bigcode/starcoder2-15b-instruct-v0.1", "codellama/CodeLlama-70b-Instruct-hf", "databricks/dbrx-instruct",
    "deepseek-ai/DeepSeek-V2-Lite-Chat", "deepseek-ai/deepseek-coder-6.7b-instruct", "google/gemma-2b-it",
    "google/gemma-3-1b-it", "gorilla-llm/gorilla-openfunctions-v2", "ibm-granite/granite-3.2-2b-instruct",
    "internlm/internlm2-chat-1_8b", "meetkai/functionary-small-v2.5", "meta-llama/Llama-2-70b-chat-hf",
    "meta-llama/Meta-Llama-Guard-2-8B", "microsoft/Phi-3-medium-128k-instruct", "microsoft/Phi-3-small-8k-instruct",
    "microsoft/Phi-3.5-mini-instruct", "microsoft/Phi-4-mini-instruct", "microsoft/Phi-4-reasoning", "microsoft/phi-4",
    "mistralai/Mistral-Nemo-Instruct-2407", "nvidia/Llama3-ChatQA-1.5-8B", "openbmb/MiniCPM3-4B",
    "openchat/openchat-3.5-0106", "tiiuae/Falcon3-3B-Instruct",
]


def load_configs(path):
    spec = importlib.util.spec_from_file_location("tokenizer_configs", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.get_tokenizer_configs()


def write_dir(out, model, cfg):
    cfg = dict(cfg)
    if isinstance(cfg.get("chat_template"), dict):
        cfg["chat_template"] = [{"name": k, "template": v} for k, v in cfg["chat_template"].items()]
    d = os.path.join(out, re.sub(r"[^A-Za-z0-9._-]", "_", model))
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8", newline="\n") as f:
        f.write(json.dumps(cfg, ensure_ascii=False, indent=1) + "\n")
    _, _, pairs = make_golden.golden_for_dir(d)
    with open(os.path.join(d, "golden.json"), "w", encoding="utf-8", newline="\n") as f:
        f.write(json.dumps([e for _, e in pairs], ensure_ascii=False, indent=1) + "\n")
    return len(pairs)


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    configs = load_configs(sys.argv[1])
    if len(sys.argv) == 4 and sys.argv[2] == "--all":
        seen, n = set(), 0
        for model, cfg in configs.items():
            key = json.dumps(cfg.get("chat_template"), sort_keys=True)
            if cfg.get("chat_template") is None or key in seen:
                continue
            seen.add(key)
            n += write_dir(sys.argv[3], model, cfg)
        print(f"{len(seen)} templates, {n} cases in {sys.argv[3]}")
        return 0
    n = sum(write_dir(OUT, m, configs[m]) for m in MODELS)
    print(f"{len(MODELS)} templates, {n} cases in {os.path.relpath(OUT, ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
