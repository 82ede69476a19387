#!/usr/bin/env python3
"""Drive a running fucina server with the official `openai` and `anthropic` Python SDKs.

Usage: run_sdk.py BASE_URL MODE
  MODE "scripted": the server runs the scripted test model (tests/common), whose replies are
  known exactly; "real": a real model, where only shapes and invariants are checked.

Exits non-zero on the first failure; prints "N passed, 0 failed" at the end.
Installed by scripts/test.sh into .cache/pyenv (pinned: openai==3.51.0, anthropic==2.10.0).
"""
import json
import sys

import anthropic
import openai

BASE, MODE = sys.argv[1], sys.argv[2]
SCRIPTED = MODE == "scripted"
REPLY = "Hello from the test model."
oa = openai.OpenAI(base_url=BASE + "/v1", api_key="test-key", max_retries=0)
an = anthropic.Anthropic(base_url=BASE, api_key="test-key", max_retries=0)
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Get the weather",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
passed = 0


def case(fn):
    global passed
    fn()
    passed += 1
    print(f"ok {fn.__name__}", flush=True)
    return fn


@case
def openai_models():
    models = oa.models.list()
    assert len(models.data) == 1 and models.data[0].id


@case
def openai_chat():
    r = oa.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=40, temperature=0)
    c = r.choices[0]
    assert c.message.role == "assistant"
    assert isinstance(c.message.content, str) and c.finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0
    if SCRIPTED:
        assert c.message.content == REPLY, c.message.content


@case
def openai_chat_stream():
    stream = oa.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=40,
                                        temperature=0, stream=True, stream_options={"include_usage": True})
    text, finish, usage = "", None, None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for ch in chunk.choices:
            text += ch.delta.content or ""
            finish = ch.finish_reason or finish
    assert finish in ("stop", "length") and usage and usage.completion_tokens > 0
    if SCRIPTED:
        assert text == REPLY, text


@case
def openai_completions():
    r = oa.completions.create(model="m", prompt="Once upon a time", max_tokens=8, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length") and isinstance(r.choices[0].text, str)
    s = oa.completions.create(model="m", prompt="Once upon a time", max_tokens=8, temperature=0, stream=True)
    streamed = "".join(c.choices[0].text for c in s if c.choices)
    assert streamed == r.choices[0].text, (streamed, r.choices[0].text)


@case
def openai_tools():
    msgs = [{"role": "user", "content": "TOOLCALL: weather in Paris?"}]
    if SCRIPTED:
        r = oa.chat.completions.create(model="m", messages=msgs, tools=[WEATHER], max_tokens=100, temperature=0)
        c = r.choices[0]
        assert c.finish_reason == "tool_calls", c
        call = c.message.tool_calls[0]
        assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
        # Streaming: the SDK's accumulator sees one tool call with complete arguments.
        with oa.chat.completions.stream(model="m", messages=msgs, tools=[WEATHER], max_tokens=100, temperature=0) as st:
            for _ in st:
                pass
            final = st.get_final_completion()
        fc = final.choices[0].message.tool_calls[0]
        assert fc.function.name == "get_weather" and json.loads(fc.function.arguments) == {"city": "Paris"}
        # Round trip with the tool result.
        msgs2 = msgs + [c.message.model_dump(exclude_none=True),
                        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21C"}]
        r2 = oa.chat.completions.create(model="m", messages=msgs2, tools=[WEATHER], max_tokens=40)
        assert r2.choices[0].message.role == "assistant"
    else:
        # A chat format without tool syntax (Gemma 3) must refuse clearly; others answer.
        try:
            r = oa.chat.completions.create(model="m", messages=msgs, tools=[WEATHER], max_tokens=32, temperature=0)
            assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
        except openai.BadRequestError as e:
            assert "tool" in str(e), e


@case
def openai_errors():
    try:
        oa.chat.completions.create(model="m", messages=[], max_tokens=5)
        raise AssertionError("empty messages accepted")
    except openai.BadRequestError as e:
        assert "messages" in str(e)
    try:
        oa.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}],
                                   response_format={"type": "json_object"})
        raise AssertionError("response_format accepted")
    except openai.BadRequestError as e:
        assert "response_format" in str(e)


@case
def anthropic_messages():
    m = an.messages.create(model="m", max_tokens=40, system="Be brief.",
                           messages=[{"role": "user", "content": "hi"}], extra_body={"temperature": 0})
    assert m.role == "assistant" and m.stop_reason in ("end_turn", "max_tokens")
    assert m.usage.input_tokens > 0 and m.usage.output_tokens > 0
    if SCRIPTED:
        assert m.content[0].type == "text" and m.content[0].text == REPLY


@case
def anthropic_stream():
    with an.messages.stream(model="m", max_tokens=40, messages=[{"role": "user", "content": "hi"}], extra_body={"temperature": 0}) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert final.stop_reason in ("end_turn", "max_tokens")
    assert text == "".join(b.text for b in final.content if b.type == "text")
    if SCRIPTED:
        assert text == REPLY


@case
def anthropic_tools_and_thinking():
    tools = [{"name": "get_weather", "description": "Get the weather",
              "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]
    if not SCRIPTED:
        try:
            m = an.messages.create(model="m", max_tokens=32, tools=tools, messages=[{"role": "user", "content": "Paris?"}])
            assert m.stop_reason in ("end_turn", "max_tokens", "tool_use")
        except anthropic.BadRequestError as e:
            assert "tool" in str(e), e
        return
    m = an.messages.create(model="m", max_tokens=100, tools=tools, messages=[{"role": "user", "content": "TOOLCALL"}])
    assert m.stop_reason == "tool_use"
    tu = [b for b in m.content if b.type == "tool_use"][0]
    assert tu.name == "get_weather" and tu.input == {"city": "Paris"}
    with an.messages.stream(model="m", max_tokens=100, tools=tools, messages=[{"role": "user", "content": "TOOLCALL"}]) as s:
        final = s.get_final_message()
    tu2 = [b for b in final.content if b.type == "tool_use"][0]
    assert tu2.input == {"city": "Paris"}
    m2 = an.messages.create(model="m", max_tokens=40, tools=tools, messages=[
        {"role": "user", "content": "TOOLCALL"},
        {"role": "assistant", "content": [b.model_dump() for b in m.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tu.id, "content": "sunny"}]}])
    assert m2.role == "assistant"
    with an.messages.stream(model="m", max_tokens=100, thinking={"type": "enabled", "budget_tokens": 1024},
                            messages=[{"role": "user", "content": "THINK"}]) as s:
        final = s.get_final_message()
    assert final.content[0].type == "thinking" and final.content[0].thinking == "Let me think."
    assert final.content[1].type == "text" and final.content[1].text == "The answer is 4."


@case
def anthropic_errors():
    try:
        an.messages.create(model="m", max_tokens=5, messages=[])
        raise AssertionError("empty messages accepted")
    except anthropic.BadRequestError as e:
        assert e.body["error"]["type"] == "invalid_request_error"


print(f"{passed} passed, 0 failed")
