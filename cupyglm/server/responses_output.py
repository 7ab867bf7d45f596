"""The Responses API's reply: output items built from GLM's split chat output (cupyglm.server.glm_output), the
streamed events that build them, the response object and its usage.

`OutputItems.feed(fields)` takes one delta's chat fields ({reasoning_content, content, tool_calls}) and returns
the events they complete; a plain reply feeds the same fields and keeps only the items, so a streamed reply and a
plain one agree. Items, in the order written: `reasoning` (GLM's thinking block, whole in `content`, `summary`
empty), `message` (one `output_text` part), `function_call` (its arguments whole at the call's end).
"""
from __future__ import annotations

import uuid


def item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


class OutputItems:
    """The reply's output items as they are written; each feed returns the (unnumbered) events it completes."""

    def __init__(self) -> None:
        self.items: list[dict] = []
        self.open: dict | None = None         # the item being written (reasoning or message)

    def feed(self, fields: dict) -> list[dict]:
        ev: list[dict] = []
        for key, value in fields.items():
            if key == "reasoning_content":
                ev += self._text("reasoning", value)
            elif key == "content":
                ev += self._text("message", value)
            elif key == "tool_calls":
                for call in value:
                    ev += self._call(call)
        return ev

    def close(self) -> list[dict]:
        """The events that end the open item (at the reply's end)."""
        item, self.open = self.open, None
        if item is None:
            return []
        idx, text = self.items.index(item), item["_text"]
        item.pop("_text")
        item["status"] = "completed"
        base = {"item_id": item["id"], "output_index": idx, "content_index": 0}
        if item["type"] == "message":
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
            item["content"] = [part]
            done = {"type": "response.output_text.done", **base, "text": text, "logprobs": []}
        else:
            part = {"type": "reasoning_text", "text": text}
            item["content"] = [part]
            done = {"type": "response.reasoning_text.done", **base, "text": text}
        return [done, {"type": "response.content_part.done", **base, "part": part},
                {"type": "response.output_item.done", "output_index": idx, "item": _public(item)}]

    def _text(self, kind: str, piece: str) -> list[dict]:
        ev: list[dict] = []
        if self.open is not None and self.open["type"] != kind:
            ev += self.close()
        if self.open is None:
            if kind == "message":
                item = {"id": item_id("msg"), "type": "message", "role": "assistant", "status": "in_progress",
                        "content": [], "_text": ""}
                part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            else:
                item = {"id": item_id("rs"), "type": "reasoning", "summary": [], "content": [],
                        "status": "in_progress", "_text": ""}
                part = {"type": "reasoning_text", "text": ""}
            self.items.append(item)
            self.open = item
            idx = len(self.items) - 1
            ev += [{"type": "response.output_item.added", "output_index": idx, "item": _public(item)},
                   {"type": "response.content_part.added", "item_id": item["id"], "output_index": idx,
                    "content_index": 0, "part": part}]
        item = self.open
        item["_text"] += piece
        base = {"item_id": item["id"], "output_index": self.items.index(item), "content_index": 0, "delta": piece}
        if kind == "message":
            ev.append({"type": "response.output_text.delta", **base, "logprobs": []})
        else:
            ev.append({"type": "response.reasoning_text.delta", **base})
        return ev

    def _call(self, call: dict) -> list[dict]:
        """A tool-call delta of GlmOutput: the first (with its name) opens the item, the second (its arguments)
        ends it."""
        fn = call.get("function") or {}
        if "name" in fn:
            ev = self.close()
            item = {"id": item_id("fc"), "type": "function_call", "call_id": call["id"], "name": fn["name"],
                    "arguments": "", "status": "in_progress"}
            self.items.append(item)
            return ev + [{"type": "response.output_item.added", "output_index": len(self.items) - 1,
                          "item": dict(item)}]
        item = next(i for i in reversed(self.items) if i["type"] == "function_call")
        idx = self.items.index(item)
        args = fn.get("arguments", "")
        item.update(arguments=args, status="completed")
        base = {"item_id": item["id"], "output_index": idx}
        return [{"type": "response.function_call_arguments.delta", **base, "delta": args},
                {"type": "response.function_call_arguments.done", **base, "arguments": args, "name": item["name"]},
                {"type": "response.output_item.done", "output_index": idx, "item": dict(item)}]

    def output(self) -> list[dict]:
        """The finished items (call after close)."""
        return [_public(i) for i in self.items if i["type"] != "function_call" or i["status"] == "completed"]


def _public(item: dict) -> dict:
    return {k: v for k, v in item.items() if not k.startswith("_")}


def responses_usage(input_tokens: int, output_tokens: int, cached: int, reasoning: int) -> dict:
    return {"input_tokens": input_tokens, "output_tokens": output_tokens, "total_tokens": input_tokens + output_tokens,
            "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": reasoning}}


def response_object(rid: str, created: int, model: str, body: dict, status: str, output: list[dict],
                    usage: dict | None, finish_reason: str | None = None) -> dict:
    """The `response` object: the request's settings echoed, the output and usage."""
    tools = body.get("tools") or []
    return {
        "id": rid, "object": "response", "created_at": created, "model": model, "status": status,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": body.get("instructions"), "metadata": body.get("metadata"),
        "output": output, "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "temperature": body.get("temperature"), "top_p": body.get("top_p"),
        "tool_choice": body.get("tool_choice") or "auto", "tools": tools,
        "max_output_tokens": body.get("max_output_tokens"), "previous_response_id": None,
        "reasoning": body.get("reasoning"), "store": False,
        "text": body.get("text") or {"format": {"type": "text"}}, "truncation": "disabled",
        "usage": usage, "user": body.get("user"),
    }


def status_of(finish_reason: str | None) -> str:
    return "incomplete" if finish_reason == "length" else "completed"
