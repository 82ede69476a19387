//! Built-in chat templates, used when a checkpoint carries none (the Gemma 3 270M GGUF has
//! none). Written for this project; they produce the prompt format each family is trained on.
//! The Gemma 3 one is checked against transformers' rendering of Google's own template.

/// Gemma 2/3: `<start_of_turn>user\n...<end_of_turn>\n`, the system prompt folded into the first
/// user turn, the assistant called `model`, content trimmed.
pub const GEMMA3: &str = r##"{{ bos_token }}
{%- if messages and messages[0]['role'] == 'system' -%}
    {%- set c = messages[0]['content'] -%}
    {%- set first_prefix = (c if c is string else c[0]['text']) + '\n\n' -%}
    {%- set turns = messages[1:] -%}
{%- else -%}
    {%- set first_prefix = '' -%}
    {%- set turns = messages -%}
{%- endif -%}
{%- for m in turns -%}
    {%- if (m['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else m['role']) + '\n' + (first_prefix if loop.first else '') }}
    {%- if m['content'] is string -%}
        {{ m['content'] | trim }}
    {%- elif m['content'] is iterable -%}
        {%- for part in m['content'] -%}
            {%- if part['type'] == 'image' -%}{{ '<start_of_image>' }}
            {%- elif part['type'] == 'text' -%}{{ part['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}
"##;

/// Gemma 4: `<|turn>role\n...<turn|>\n`; tools declared in the system turn as
/// `<|tool>declaration:NAME{...}<tool|>`; `<|think|>` in the system turn turns thinking on;
/// calls `<|tool_call>call:NAME{...}<tool_call|>`; results `<|tool_response>response:NAME{...}
/// <tool_response|>`; strings in these bodies delimited by `<|"|>`.
pub const GEMMA4: &str = r##"{{- bos_token -}}
{%- set ns = namespace(sys='', turns=messages) -%}
{%- if messages and messages[0]['role'] in ['system', 'developer'] -%}
    {%- set c = messages[0]['content'] -%}
    {%- set ns.sys = c if c is string else c | map(attribute='text') | join('') -%}
    {%- set ns.turns = messages[1:] -%}
{%- endif -%}
{%- if ns.sys or tools or enable_thinking -%}
    {{- '<|turn>system\n' -}}
    {%- if enable_thinking -%}{{- '<|think|>' -}}{%- endif -%}
    {{- ns.sys | trim -}}
    {%- for t in tools or [] -%}
        {%- set f = t['function'] if t['function'] is defined else t -%}
        {{- '<|tool>declaration:' + f['name'] + ({'description': f['description'] or '', 'parameters': f['parameters'] or {}} | fucina_gemma4) + '<tool|>' -}}
    {%- endfor -%}
    {{- '<turn|>\n' -}}
{%- endif -%}
{%- for m in ns.turns -%}
    {%- if m['role'] == 'tool' -%}
        {{- '<|turn>user\n<|tool_response>response:' + (m['name'] or 'tool') + ({'value': m['content']} | fucina_gemma4) + '<tool_response|><turn|>\n' -}}
    {%- else -%}
        {{- '<|turn>' + ('model' if m['role'] == 'assistant' else m['role']) + '\n' -}}
        {%- if m['content'] is string -%}
            {{- m['content'] | trim -}}
        {%- elif m['content'] is iterable -%}
            {%- for part in m['content'] -%}
                {%- if part['type'] == 'text' -%}{{- part['text'] | trim -}}{%- endif -%}
            {%- endfor -%}
        {%- endif -%}
        {%- for tc in m['tool_calls'] or [] -%}
            {%- set f = tc['function'] if tc['function'] is defined else tc -%}
            {{- '<|tool_call>call:' + f['name'] + (f['arguments'] | fucina_gemma4) + '<tool_call|>' -}}
        {%- endfor -%}
        {{- '<turn|>\n' -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|turn>model\n' -}}{%- endif -%}
"##;

/// Qwen ChatML (Qwen3 family): `<|im_start|>role\n...<|im_end|>\n`, tools listed as JSON in
/// the system turn, calls as JSON inside `<tool_call>`, results grouped into a user turn inside
/// `<tool_response>`, reasoning kept only after the last user query, and an empty think block
/// when thinking is off.
pub const CHATML: &str = r##"{%- set ns = namespace(last_query=messages | length - 1, turns=messages, sys='') -%}
{%- if messages and messages[0]['role'] == 'system' -%}
    {%- set ns.sys = messages[0]['content'] -%}
    {%- set ns.turns = messages[1:] -%}
{%- endif -%}
{%- if tools -%}
    {{- '<|im_start|>system\n' -}}
    {%- if ns.sys -%}{{- ns.sys + '\n\n' -}}{%- endif -%}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" -}}
    {%- for t in tools -%}{{- '\n' + (t | tojson) -}}{%- endfor -%}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" -}}
{%- elif ns.sys -%}
    {{- '<|im_start|>system\n' + ns.sys + '<|im_end|>\n' -}}
{%- endif -%}
{%- for m in messages -%}
    {%- if m['role'] == 'user' and not (m['content'] is string and m['content'].startswith('<tool_response>')) -%}
        {%- set ns.last_query = loop.index0 -%}
    {%- endif -%}
{%- endfor -%}
{%- for m in messages -%}
    {%- if loop.first and m['role'] == 'system' -%}
    {%- elif m['role'] in ['user', 'system'] -%}
        {{- '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' -}}
    {%- elif m['role'] == 'assistant' -%}
        {%- set content = m['content'] or '' -%}
        {%- set reasoning = m['reasoning_content'] or '' -%}
        {%- if not reasoning and '</think>' in content -%}
            {%- set reasoning = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') -%}
            {%- set content = content.split('</think>')[-1].lstrip('\n') -%}
        {%- endif -%}
        {{- '<|im_start|>assistant\n' -}}
        {%- if loop.index0 > ns.last_query and (loop.last or reasoning) -%}
            {{- '<think>\n' + reasoning.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') -}}
        {%- else -%}
            {{- content -}}
        {%- endif -%}
        {%- for tc in m['tool_calls'] or [] -%}
            {%- if not loop.first or content -%}{{- '\n' -}}{%- endif -%}
            {%- set f = tc['function'] if tc['function'] is defined else tc -%}
            {{- '<tool_call>\n{"name": "' + f['name'] + '", "arguments": ' -}}
            {{- f['arguments'] if f['arguments'] is string else f['arguments'] | tojson -}}
            {{- '}\n</tool_call>' -}}
        {%- endfor -%}
        {{- '<|im_end|>\n' -}}
    {%- elif m['role'] == 'tool' -%}
        {%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
        {{- '\n<tool_response>\n' + m['content'] + '\n</tool_response>' -}}
        {%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' -%}{{- '<|im_end|>\n' -}}{%- endif -%}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant\n' -}}
    {%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\n\n</think>\n\n' -}}{%- endif -%}
{%- endif -%}
"##;
