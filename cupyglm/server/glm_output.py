"""GLM's chat output split as OpenAI clients expect: `reasoning_content` from the thinking block, `content`, and
`tool_calls` parsed from GLM's tool-call format, incrementally (streamed deltas) and whole (the same parser fed
everything at once, so a streamed reply and a plain one agree).

Thinking: with thinking on, an output that starts with `<think>` holds reasoning until `</think>` (an output
cut before `</think>` is all reasoning); any other output is content. Tool calls (with `tools` given and
tool_choice not "none"), as GLM-4.5 writes them:

    <tool_call>NAME
    <arg_key>KEY</arg_key>
    <arg_value>VALUE</arg_value>
    ...
    </tool_call>

each becomes {"id", "type": "function", "function": {"name", "arguments": JSON}}; a value is kept as written when
the tool's schema types that argument "string" (cupyglm.engine.tool_values.is_raw), else JSON-decoded when it
parses (kept as a string when not). With `max_calls` (parallel_tool_calls false: 1), the calls past it are
dropped whole, neither calls nor content. Streamed, a call shows as a first delta (index, id, type, name,
arguments "") once its name line is complete, then one delta with its whole arguments at `</tool_call>` (as
vLLM's GLM tool parser streams them).
"""
from __future__ import annotations

import json
import re
import uuid
from typing import Any

from cupyglm.engine.tool_values import is_raw

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
_ARG = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.S)


def _held(buf: str, tag: str) -> int:
    """How many trailing characters of buf could start `tag` (kept back until the next piece decides)."""
    for n in range(min(len(tag) - 1, len(buf)), 0, -1):
        if tag.startswith(buf[-n:]):
            return n
    return 0


class GlmOutput:
    """Feed text pieces; each `feed` returns the OpenAI delta fields they complete."""

    def __init__(self, thinking: bool, tools: list[dict] | None, max_calls: int | None = None):
        self.mode = "start" if thinking else "content"
        self.tools = {t["function"]["name"]: t["function"] for t in tools or []}
        self.parse_tools = bool(tools)
        self.max_calls = max_calls
        self.buf = ""
        self.call = None                 # the tool call being read: its text after <tool_call>
        self.calls: list[dict] = []
        self.reasoning = self.content = ""
        self.strip_nl = False            # drop the newlines that follow </think> or </tool_call>

    def feed(self, text: str, final: bool = False) -> list[dict]:
        self.buf += text
        out: list[dict] = []
        while True:
            step = getattr(self, f"_{self.mode}")(final)
            if step is None:
                break
            out.append(step)
        return [d for d in out if d]

    # ---- modes: each returns a delta dict (possibly empty) to go on, or None to wait for more text ----
    def _start(self, final: bool):
        s = self.buf.lstrip()
        if s.startswith(THINK_OPEN):
            self.buf, self.mode = s[len(THINK_OPEN):], "reasoning"
            return {}
        if THINK_OPEN.startswith(s) and not final:
            return None
        self.mode = "content"
        return {}

    def _reasoning(self, final: bool):
        i = self.buf.find(THINK_CLOSE)
        if i >= 0:
            piece, self.buf, self.mode = self.buf[:i], self.buf[i + len(THINK_CLOSE):], "content"
            self.strip_nl = True
            return self._say("reasoning_content", piece)
        keep = 0 if final else _held(self.buf, THINK_CLOSE)
        piece, self.buf = self.buf[:len(self.buf) - keep], self.buf[len(self.buf) - keep:]
        return self._say("reasoning_content", piece) if piece else None

    def _content(self, final: bool):
        if self.strip_nl:
            self.buf = self.buf.lstrip("\n")
            if not self.buf:
                return None
            self.strip_nl = False
        i = self.buf.find(CALL_OPEN) if self.parse_tools else -1
        if i >= 0:
            full = self.max_calls is not None and len(self.calls) >= self.max_calls
            piece, self.buf, self.mode = self.buf[:i], self.buf[i + len(CALL_OPEN):], "drop" if full else "call"
            self.call = None
            return self._say("content", piece)
        keep = 0 if final or not self.parse_tools else _held(self.buf, CALL_OPEN)
        piece, self.buf = self.buf[:len(self.buf) - keep], self.buf[len(self.buf) - keep:]
        return self._say("content", piece) if piece else None

    def _call(self, final: bool):
        if self.call is None:
            nl = self.buf.find("\n")
            end = self.buf.find(CALL_CLOSE)
            if nl < 0 and end < 0:
                return self._unfinished() if final else None
            cut = nl if nl >= 0 and (end < 0 or nl < end) else end
            self.call = {"index": len(self.calls), "id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                         "function": {"name": self.buf[:cut].strip(), "arguments": ""}}
            self.buf = self.buf[cut:]
            self.calls.append(self.call)
            return {"tool_calls": [json.loads(json.dumps(self.call))]}
        end = self.buf.find(CALL_CLOSE)
        if end < 0:
            return self._unfinished() if final else None
        args = self._arguments(self.call["function"]["name"], self.buf[:end])
        self.call["function"]["arguments"] = args
        self.buf, self.mode = self.buf[end + len(CALL_CLOSE):], "content"
        self.strip_nl = True
        return {"tool_calls": [{"index": self.call["index"], "function": {"arguments": args}}]}

    def _drop(self, final: bool):
        """A call past max_calls: its text up to and with `</tool_call>` (or to the end) is dropped."""
        end = self.buf.find(CALL_CLOSE)
        if end < 0 and not final:
            self.buf = self.buf[len(self.buf) - _held(self.buf, CALL_CLOSE):]
            return None
        self.buf = "" if end < 0 else self.buf[end + len(CALL_CLOSE):]
        self.mode, self.strip_nl = "content", True
        return {}

    def _unfinished(self):
        """The output ended inside a tool call: what was read stays as content text."""
        head = CALL_OPEN + ("" if self.call is None else self.call["function"]["name"])
        if self.call is not None:
            self.calls.pop()
        self.call, self.mode = None, "content"
        piece, self.buf = head + self.buf, ""
        return self._say("content", piece)

    def _arguments(self, name: str, body: str) -> str:
        props = ((self.tools.get(name) or {}).get("parameters") or {}).get("properties") or {}
        args: dict[str, Any] = {}
        for key, value in _ARG.findall(body):
            key = key.strip()
            if not is_raw(props.get(key)):
                try:
                    value = json.loads(value)
                except ValueError:
                    pass
            args[key] = value
        return json.dumps(args, ensure_ascii=False)

    def _say(self, field: str, piece: str) -> dict:
        if not piece:
            return {}
        if field == "content":
            self.content += piece
        else:
            self.reasoning += piece
        return {field: piece}

    def message(self) -> dict:
        """The whole reply as a chat message (after the last feed, with final=True)."""
        m: dict[str, Any] = {"role": "assistant", "content": self.content if (self.content or not self.calls)
                             else None}
        if self.reasoning:
            m["reasoning_content"] = self.reasoning
        if self.calls:
            m["tool_calls"] = [{k: v for k, v in c.items() if k != "index"} for c in self.calls]
        return m
