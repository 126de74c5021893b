#!/usr/bin/env python3
"""Render the tool-calling branches of the fixture chat templates with Python jinja2 and write
tests/fixtures/chat_templates/tool_golden.json (checked by tests/chat_template.rs).

Usage: python3 tools/tool_call_golden.py [--check]

The goldens of make_golden.py pass tools = None, so the templates' tool code (JSON-schema
rendering macros, tool-call formatting) is parsed but never run. This script renders, for every
template of tests/fixtures/chat_templates and tests/fixtures/chat_templates_extra whose text
mentions `tools`, a conversation with a tool list and one with a tool call and its result,
under the same environment and rules (make_golden.py); what raises is recorded as an error.
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
FIX = os.path.join(ROOT, "tests", "fixtures")
sys.path.insert(0, os.path.join(FIX, "chat_templates"))
import make_golden  # noqa: E402

OUT = os.path.join(FIX, "chat_templates", "tool_golden.json")

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {"type": "object", "properties": {
            "location": {"type": "string", "description": "The city, e.g. \"Paris\""},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
            "days": {"type": "integer", "description": "Days ahead", "minimum": 0},
            "hourly": {"type": "boolean"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "where": {"type": ["string", "null"], "description": "nullable"},
        }, "required": ["location"]},
    }},
    {"type": "function", "function": {"name": "now", "description": "The time.", "parameters": {"type": "object", "properties": {}}}},
]

CASES = [
    ("tools_available", [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the weather in Paris?"},
    ], True),
    ("tool_call_and_result", [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "id": "a1b2c3d4e",
            "function": {"name": "get_weather", "arguments": {"location": "Paris", "unit": "celsius"}}}]},
        {"role": "tool", "tool_call_id": "a1b2c3d4e", "name": "get_weather", "content": "{\"temp\": 22}"},
    ], True),
    ("tool_call_string_arguments", [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [{"type": "function", "id": "f5g6h7i8j",
            "function": {"name": "get_weather", "arguments": "{\"location\": \"Oslo\"}"}}]},
        {"role": "tool", "tool_call_id": "f5g6h7i8j", "content": "cold"},
    ], False),
]


def main():
    env = make_golden.make_env()
    out = []
    for root in ("chat_templates", "chat_templates_extra"):
        for name, path in make_golden.template_dirs(os.path.join(FIX, root)):
            cfg, template, special = make_golden.load_template_dir(path)
            if "tools" not in template:
                continue
            for case, messages, agp in CASES:
                messages = make_golden.alias_reasoning_fields(json.loads(json.dumps(messages)))
                entry = {"template": f"{root}/{name}", "case": case, "messages": messages, "tools": TOOLS,
                         "add_generation_prompt": agp}
                try:
                    text = env.from_string(template).render(messages=messages, tools=TOOLS, documents=None,
                                                            add_generation_prompt=agp, **special)
                    entry["rendered"] = text
                except Exception as e:  # noqa: BLE001 -- recorded
                    entry["error"] = str(e)
                    entry["error_type"] = type(e).__name__
                out.append(entry)
    text = json.dumps(out, ensure_ascii=False, indent=1) + "\n"
    if "--check" in sys.argv:
        with open(OUT, encoding="utf-8") as f:
            same = f.read() == text
        print(f"{len(out)} cases, " + ("matches" if same else "DIFFERS from") + " tool_golden.json")
        return 0 if same else 1
    with open(OUT, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)
    errors = sum("error" in e for e in out)
    print(f"{len(out)} cases ({errors} errors) written to {os.path.relpath(OUT, ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
