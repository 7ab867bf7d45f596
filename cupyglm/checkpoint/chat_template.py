"""The chat template: GLM-4.5's jinja2 template, compiled in a sandbox with Hugging Face's filters, and the
message checks run before rendering."""
from __future__ import annotations

import json
from typing import Any, Sequence

CHAT_ROLES = ("system", "user", "assistant", "tool")


class ChatTemplateError(ValueError):
    """A chat template refused its input (raise_exception) or a message is malformed."""


# ---- the chat template ---------------------------------------------------------------------------------
# A GLM-4.5-style template (rendered with trim_blocks + lstrip_blocks, as Hugging Face renders templates):
#   [gMASK]<sop>, then per message <|system|>\n{text} | <|user|>\n{text}[/nothink] |
#   <|assistant|>\n<think>{reasoning}</think>\n{text} | <|observation|>\n<tool_response>...;
#   reasoning is kept only for assistant turns after the last user turn; the generation prompt is
#   <|assistant|>, plus \n<think></think> when thinking is off. An image part renders as
#   <|begin_of_image|><|image|><|end_of_image|> (a video part likewise): the processor repeats the placeholder once
#   per merged image row (cupyglm.server.images).
GLM_CHAT_TEMPLATE = r"""[gMASK]<sop>
{%- macro text_of(content) -%}
    {%- if content is none -%}
    {%- elif content is string -%}
        {{- content -}}
    {%- elif content is mapping -%}
        {{- raise_exception('message content must be a string or a list of text parts') -}}
    {%- elif content is iterable -%}
        {%- for part in content -%}
            {%- if part is string -%}
                {{- part -}}
            {%- elif part is mapping and part.type == 'text' -%}
                {{- part.text -}}
            {%- elif part is mapping and part.type in ('image', 'image_url') -%}
                {{- '<|begin_of_image|><|image|><|end_of_image|>' -}}
            {%- elif part is mapping and part.type in ('video', 'video_url') -%}
                {{- '<|begin_of_video|><|video|><|end_of_video|>' -}}
            {%- else -%}
                {{- raise_exception('unsupported content part type: ' ~ (part.type if part is mapping else part)) -}}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{- content -}}
    {%- endif -%}
{%- endmacro -%}
{%- set thinking_off = enable_thinking is defined and not enable_thinking -%}
{%- if tools -%}
<|system|>
# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{% for tool in tools %}
{{ tool | tojson(ensure_ascii=False) }}
{% endfor %}
</tools>

For each function call, output the function name and arguments within the following XML format:
<tool_call>{function-name}
<arg_key>{arg-key-1}</arg_key>
<arg_value>{arg-value-1}</arg_value>
<arg_key>{arg-key-2}</arg_key>
<arg_value>{arg-value-2}</arg_value>
...
</tool_call>
{%- endif -%}
{%- set state = namespace(last_user=-1) -%}
{%- for m in messages -%}
    {%- if m.role == 'user' -%}{%- set state.last_user = loop.index0 -%}{%- endif -%}
{%- endfor -%}
{%- for m in messages -%}
    {%- if m.role == 'system' -%}
        {{- '<|system|>\n' + text_of(m.content) -}}
    {%- elif m.role == 'user' -%}
        {%- set text = text_of(m.content) -%}
        {{- '<|user|>\n' + text -}}
        {%- if thinking_off and not text.endswith('/nothink') -%}{{- '/nothink' -}}{%- endif -%}
    {%- elif m.role == 'assistant' -%}
        {%- set text = text_of(m.content) -%}
        {%- set reasoning = '' -%}
        {%- if m.reasoning_content is string -%}
            {%- set reasoning = m.reasoning_content -%}
        {%- elif '</think>' in text -%}
            {%- set reasoning = text.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') -%}
            {%- set text = text.split('</think>')[-1].lstrip('\n') -%}
        {%- endif -%}
        {{- '<|assistant|>' -}}
        {%- if loop.index0 > state.last_user and reasoning -%}
            {{- '\n<think>' + reasoning.strip() + '</think>' -}}
        {%- else -%}
            {{- '\n<think></think>' -}}
        {%- endif -%}
        {%- if text.strip() -%}{{- '\n' + text.strip() -}}{%- endif -%}
        {%- if m.tool_calls -%}
            {%- for call in m.tool_calls -%}
                {%- set fn = call.function if call.function is defined else call -%}
                {{- '\n<tool_call>' + fn.name + '\n' -}}
                {%- set args = fn.arguments -%}
                {%- if args is string -%}{%- set args = args | fromjson -%}{%- endif -%}
                {%- for key, value in args.items() -%}
                    {{- '<arg_key>' + key + '</arg_key>\n<arg_value>' -}}
                    {{- value if value is string else value | tojson(ensure_ascii=False) -}}
                    {{- '</arg_value>\n' -}}
                {%- endfor -%}
                {{- '</tool_call>' -}}
            {%- endfor -%}
        {%- endif -%}
    {%- elif m.role == 'tool' -%}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|observation|>' -}}{%- endif -%}
        {{- '\n<tool_response>\n' + text_of(m.content) + '\n</tool_response>' -}}
    {%- else -%}
        {{- raise_exception('unknown message role: ' ~ m.role) -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|assistant|>' -}}
    {%- if thinking_off -%}{{- '\n<think></think>' -}}{%- endif -%}
{%- endif -%}
"""

def _raise_exception(message: str):
    raise ChatTemplateError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # Hugging Face's tojson: plain json.dumps, no HTML escaping (jinja2's builtin escapes <, >, &).
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


_TEMPLATE_CACHE: dict[str, Any] = {}


def compile_chat_template(source: str):
    """A jinja2 template in an immutable sandbox, compiled once per source text."""
    tpl = _TEMPLATE_CACHE.get(source)
    if tpl is None:
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[jinja2.ext.loopcontrols])
        env.filters["tojson"] = _tojson
        env.filters["fromjson"] = json.loads
        env.globals["raise_exception"] = _raise_exception
        tpl = env.from_string(source)
        _TEMPLATE_CACHE[source] = tpl
    return tpl


def check_messages(messages: Sequence[dict]) -> list[dict]:
    """`messages` as the template renders them: known roles, content a string or a list of text and image parts."""
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise ChatTemplateError(f"message {i} is not an object")
        role = m.get("role")
        if role not in CHAT_ROLES:
            raise ChatTemplateError(f"message {i}: unknown role {role!r} (expected one of {', '.join(CHAT_ROLES)})")
        content = m.get("content")
        if isinstance(content, list):
            for j, part in enumerate(content):
                if isinstance(part, str) or (isinstance(part, dict) and part.get("type") in ("image", "image_url")):
                    continue
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                    raise ChatTemplateError(f"message {i}: content part {j} has unsupported type {kind!r}")
        elif content is not None and not isinstance(content, str):
            raise ChatTemplateError(f"message {i}: content must be a string or a list of text parts")
        out.append(m)
    return out
