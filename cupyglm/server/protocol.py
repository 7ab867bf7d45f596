"""The OpenAI-compatible wire format: request validation, response and chunk shapes, SSE framing, error JSON.

Pure functions, no I/O: every check raises `ApiError` carrying the HTTP status and the OpenAI error object
(`{"error": {"message", "type", "param", "code"}}`), with `param` naming the offending field. Known OpenAI fields
that would change the output but are not built yet (logprobs, penalties, drafts, ...) are refused by name, never
accepted and ignored; fields that change nothing (`user`, `metadata`, ...) and unknown extension fields are
accepted as vLLM does.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

MAX_STOP_STRINGS = 4
MAX_STOP_TOKEN_IDS = 64
MAX_SEED = 2**64 - 1
MAX_INT32 = 2**31 - 1
CHAT_ROLES = ("system", "user", "assistant", "tool")

# type strings of the OpenAI error object, by status
_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "invalid_request_error",
          405: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error",
          500: "server_error", 503: "service_unavailable_error"}


class ApiError(Exception):
    """An error reply: HTTP status + OpenAI error object (+ extra headers, e.g. Retry-After)."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 type: str | None = None, headers: Mapping[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or _TYPES.get(status, "invalid_request_error")
        self.headers = dict(headers or {})

    def body(self) -> dict:
        return error_body(self.message, type=self.type, param=self.param, code=self.code)


def error_body(message: str, *, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def bad(param: str | None, message: str, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


# ---- hashing, ids, SSE ------------------------------------------------------------------------------------------

def token_sha(ids: Sequence[int]) -> str:
    """First 12 hex chars of SHA-256 over the token ids joined by commas (the receipts' exactness hash)."""
    return hashlib.sha256(",".join(str(int(i)) for i in ids).encode()).hexdigest()[:12]


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def sse(obj: Any) -> bytes:
    """One SSE frame: `data: {json}\\n\\n`."""
    return f"data: {dumps(obj)}\n\n".encode()


SSE_DONE = b"data: [DONE]\n\n"


def sse_error(err: ApiError) -> bytes:
    return sse(err.body())


# ---- the body ---------------------------------------------------------------------------------------------------

def parse_json_object(raw: bytes) -> dict:
    """The request body as a JSON object: 400 on invalid UTF-8, invalid JSON, or a body that is not an object."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise bad(None, f"request body is not valid UTF-8 (byte {e.start})", "invalid_utf8") from None
    if text.startswith("\ufeff"):
        text = text[1:]
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except ValueError as e:
        raise bad(None, f"request body is not valid JSON: {e}", "invalid_json") from None
    if not isinstance(value, dict):
        raise bad(None, f"request body must be a JSON object, got {_kind(value)}", "invalid_type")
    return value


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _kind(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, int):
        return "an integer"
    if isinstance(v, float):
        return "a number"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, list):
        return "an array"
    if isinstance(v, dict):
        return "an object"
    return type(v).__name__


# ---- typed field getters ----------------------------------------------------------------------------------------

def get_bool(body: Mapping, name: str, default: bool | None = None, param: str | None = None) -> bool | None:
    v = body.get(name)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise bad(param or name, f"'{param or name}' must be a boolean, got {_kind(v)}", "invalid_type")
    return v


def get_int(body: Mapping, name: str, default: int | None = None, *, lo: int | None = None,
            hi: int | None = None, param: str | None = None) -> int | None:
    p = param or name
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, float) and v.is_integer() and math.isfinite(v):
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        raise bad(p, f"'{p}' must be an integer, got {_kind(v)}", "invalid_type")
    if lo is not None and v < lo:
        raise bad(p, f"'{p}' must be at least {lo}, got {v}")
    if hi is not None and v > hi:
        raise bad(p, f"'{p}' must be at most {hi}, got {v}")
    return v


def get_float(body: Mapping, name: str, default: float | None = None, *, lo: float | None = None,
              hi: float | None = None, lo_open: bool = False, param: str | None = None) -> float | None:
    p = param or name
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise bad(p, f"'{p}' must be a number, got {_kind(v)}", "invalid_type")
    v = float(v)
    if not math.isfinite(v):
        raise bad(p, f"'{p}' must be a finite number")
    if lo is not None and (v < lo or (lo_open and v == lo)):
        rng = f"({lo:g}, {hi:g}]" if lo_open else f"[{lo:g}, {hi:g}]"
        raise bad(p, f"'{p}' must be in {rng}, got {v:g}")
    if hi is not None and v > hi:
        rng = f"({lo:g}, {hi:g}]" if lo_open else f"[{lo:g}, {hi:g}]"
        raise bad(p, f"'{p}' must be in {rng}, got {v:g}")
    return v


def get_str(body: Mapping, name: str, default: str | None = None, param: str | None = None) -> str | None:
    v = body.get(name)
    if v is None:
        return default
    if not isinstance(v, str):
        raise bad(param or name, f"'{param or name}' must be a string, got {_kind(v)}", "invalid_type")
    return v


def get_dict(body: Mapping, name: str, param: str | None = None) -> dict:
    v = body.get(name)
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise bad(param or name, f"'{param or name}' must be an object, got {_kind(v)}", "invalid_type")
    return v


def check_token_ids(v: Any, param: str, vocab_size: int, *, allow_empty: bool = False) -> list[int]:
    if not isinstance(v, list):
        raise bad(param, f"'{param}' must be an array of token ids, got {_kind(v)}", "invalid_type")
    if not v and not allow_empty:
        raise bad(param, f"'{param}' must not be empty")
    for i, t in enumerate(v):
        if isinstance(t, bool) or not isinstance(t, int):
            raise bad(param, f"'{param}[{i}]' must be an integer token id, got {_kind(t)}", "invalid_type")
        if t < 0 or t >= vocab_size:
            raise bad(param, f"'{param}[{i}]' = {t} is not a token id of this model (0..{vocab_size - 1})",
                      "invalid_token_id")
    return list(v)


# ---- the request ------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ModelInfo:
    """What validation needs to know about the served model."""

    served_id: str
    aliases: frozenset[str]          # names also accepted in `model` (checkpoint dir basename, path)
    max_model_len: int
    vocab_size: int


@dataclasses.dataclass
class GenRequest:
    """A validated generation request (chat or completion) before tokenization of its prompt."""

    kind: str                                   # "chat" | "completion"
    model: str
    stream: bool
    include_usage: bool
    return_token_ids: bool
    sampling: dict                              # SamplingParams kwargs (max_tokens may be None: fill later)
    messages: list[dict] | None = None          # chat
    chat_kwargs: dict = dataclasses.field(default_factory=dict)
    add_generation_prompt: bool = True
    prompt_text: str | None = None              # completion, text prompt
    prompt_ids: list[int] | None = None         # completion, token prompt
    cache_salt: str | None = None

    @property
    def prompt_param(self) -> str:
        return "messages" if self.kind == "chat" else "prompt"


def check_model(body: Mapping, info: ModelInfo) -> str:
    name = body.get("model")
    if name is None:
        return info.served_id
    if not isinstance(name, str):
        raise bad("model", f"'model' must be a string, got {_kind(name)}", "invalid_type")
    if name != info.served_id and name not in info.aliases:
        raise ApiError(404, f"The model '{name}' does not exist; this server serves '{info.served_id}'",
                       param="model", code="model_not_found")
    return info.served_id


def _unsupported(param: str, what: str = "") -> ApiError:
    return bad(param, f"'{param}' is not supported yet{what}", "unsupported_parameter")


def _refuse_unsupported(body: Mapping, kind: str) -> None:
    # n / best_of: one choice per request
    n = get_int(body, "n", 1, lo=1)
    if n != 1:
        raise bad("n", f"'n' = {n} is not supported: only n = 1", "unsupported_parameter")
    best_of = get_int(body, "best_of", 1, lo=1)
    if best_of != 1:
        raise bad("best_of", f"'best_of' = {best_of} is not supported: only 1", "unsupported_parameter")
    # logprobs in every shape
    lp = body.get("logprobs")
    if kind == "chat":
        if lp is not None and lp is not False:
            if not isinstance(lp, bool):
                raise bad("logprobs", f"'logprobs' must be a boolean, got {_kind(lp)}", "invalid_type")
            raise _unsupported("logprobs")
    elif lp is not None:
        if isinstance(lp, bool) or not isinstance(lp, int):
            raise bad("logprobs", f"'logprobs' must be an integer, got {_kind(lp)}", "invalid_type")
        raise _unsupported("logprobs")
    for name in ("top_logprobs", "prompt_logprobs"):
        if body.get(name) is not None:
            raise _unsupported(name)
    for name in ("presence_penalty", "frequency_penalty"):
        v = get_float(body, name, 0.0, lo=-2.0, hi=2.0)
        if v != 0.0:
            raise _unsupported(name, " (only 0)")
    rp = get_float(body, "repetition_penalty", 1.0, lo=0.0, hi=10.0)
    if rp != 1.0:
        raise _unsupported("repetition_penalty", " (only 1)")
    lb = body.get("logit_bias")
    if lb is not None:
        if not isinstance(lb, dict):
            raise bad("logit_bias", f"'logit_bias' must be an object, got {_kind(lb)}", "invalid_type")
        if lb:
            raise _unsupported("logit_bias")
    rf = body.get("response_format")
    if rf is not None:
        if not isinstance(rf, dict):
            raise bad("response_format", f"'response_format' must be an object, got {_kind(rf)}", "invalid_type")
        if rf.get("type", "text") != "text":
            raise _unsupported("response_format", " (only type 'text')")
    if kind == "chat":
        tools = body.get("tools")
        if tools is not None:
            if not isinstance(tools, list):
                raise bad("tools", f"'tools' must be an array, got {_kind(tools)}", "invalid_type")
            if tools:
                raise _unsupported("tools")
        tc = body.get("tool_choice")
        if tc is not None and tc not in ("none", "auto"):
            raise _unsupported("tool_choice")
    else:
        if get_bool(body, "echo", False):
            raise _unsupported("echo")
        if get_str(body, "suffix"):
            raise _unsupported("suffix")
    d = get_bool(body, "draft", False)
    if d:
        raise bad("draft", "'draft': true is not supported yet (MTP drafts are not available); send false",
                  "unsupported_parameter")


def _stop(body: Mapping) -> tuple[str, ...]:
    v = body.get("stop")
    if v is None:
        return ()
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list):
        raise bad("stop", f"'stop' must be a string or an array of strings, got {_kind(v)}", "invalid_type")
    if len(v) > MAX_STOP_STRINGS:
        raise bad("stop", f"'stop' has {len(v)} strings; at most {MAX_STOP_STRINGS} are allowed")
    for i, s in enumerate(v):
        if not isinstance(s, str):
            raise bad("stop", f"'stop[{i}]' must be a string, got {_kind(s)}", "invalid_type")
        if not s:
            raise bad("stop", f"'stop[{i}]' must not be empty")
    return tuple(v)


def _sampling(body: Mapping, info: ModelInfo) -> dict:
    max_tokens = get_int(body, "max_tokens", None, lo=1)
    mct = get_int(body, "max_completion_tokens", None, lo=1)
    if mct is not None:
        max_tokens = mct
    param_max = "max_completion_tokens" if mct is not None else "max_tokens"
    if max_tokens is not None and max_tokens > info.max_model_len:
        raise ApiError(400, f"'{param_max}' = {max_tokens} exceeds this model's maximum context length of "
                       f"{info.max_model_len} tokens", param=param_max, code="context_length_exceeded")
    min_tokens = get_int(body, "min_tokens", 0, lo=0, hi=info.max_model_len)
    if max_tokens is not None and min_tokens > max_tokens:
        raise bad("min_tokens", f"'min_tokens' = {min_tokens} exceeds '{param_max}' = {max_tokens}")
    temperature = get_float(body, "temperature", 1.0, lo=0.0, hi=2.0)
    top_p = get_float(body, "top_p", 1.0, lo=0.0, hi=1.0, lo_open=True)
    top_k = get_int(body, "top_k", 0, lo=-1, hi=MAX_INT32)
    min_p = get_float(body, "min_p", 0.0, lo=0.0, hi=1.0)
    seed = get_int(body, "seed", None, lo=0, hi=MAX_SEED)
    ignore_eos = get_bool(body, "ignore_eos", False)
    skip_special = get_bool(body, "skip_special_tokens", True)
    stop_ids = body.get("stop_token_ids")
    stop_ids = () if stop_ids is None else tuple(
        check_token_ids(stop_ids, "stop_token_ids", info.vocab_size, allow_empty=True))
    if len(stop_ids) > MAX_STOP_TOKEN_IDS:
        raise bad("stop_token_ids", f"'stop_token_ids' has {len(stop_ids)} ids; at most {MAX_STOP_TOKEN_IDS}")
    return dict(temperature=temperature, top_p=top_p, top_k=max(top_k, 0), min_p=min_p, seed=seed,
                max_tokens=max_tokens, min_tokens=min_tokens, stop=_stop(body), stop_token_ids=stop_ids,
                ignore_eos=ignore_eos, skip_special_tokens=skip_special)


def _common(body: Mapping, kind: str, info: ModelInfo) -> dict:
    model = check_model(body, info)
    _refuse_unsupported(body, kind)
    stream = get_bool(body, "stream", False)
    so = body.get("stream_options")
    include_usage = False
    if so is not None:
        if not isinstance(so, dict):
            raise bad("stream_options", f"'stream_options' must be an object, got {_kind(so)}", "invalid_type")
        if not stream:
            raise bad("stream_options", "'stream_options' is only allowed when 'stream' is true")
        include_usage = bool(get_bool(so, "include_usage", False, param="stream_options.include_usage"))
        get_bool(so, "continuous_usage_stats", False, param="stream_options.continuous_usage_stats")
    return dict(model=model, stream=stream, include_usage=include_usage,
                return_token_ids=bool(get_bool(body, "return_token_ids", False)),
                sampling=_sampling(body, info), cache_salt=get_str(body, "cache_salt"))


def _check_message(i: int, m: Any) -> dict:
    p = f"messages[{i}]"
    if not isinstance(m, dict):
        raise bad(p, f"'{p}' must be an object, got {_kind(m)}", "invalid_type")
    role = m.get("role")
    if not isinstance(role, str):
        raise bad(f"{p}.role", f"'{p}.role' must be a string, got {_kind(role)}", "invalid_type")
    if role not in CHAT_ROLES:
        raise bad(f"{p}.role", f"'{p}.role' = {role!r} is not a supported role ({', '.join(CHAT_ROLES)})")
    content = m.get("content")
    if content is None:
        if role != "assistant":
            raise bad(f"{p}.content", f"'{p}.content' is required for role {role!r}", "missing_required_parameter")
    elif isinstance(content, list):
        for j, part in enumerate(content):
            pp = f"{p}.content[{j}]"
            if not isinstance(part, dict):
                raise bad(pp, f"'{pp}' must be an object, got {_kind(part)}", "invalid_type")
            if part.get("type") != "text":
                raise bad(pp, f"'{pp}.type' = {part.get('type')!r} is not supported (only 'text')",
                          "unsupported_parameter")
            if not isinstance(part.get("text"), str):
                raise bad(pp, f"'{pp}.text' must be a string", "invalid_type")
    elif not isinstance(content, str):
        raise bad(f"{p}.content", f"'{p}.content' must be a string or an array of text parts, got {_kind(content)}",
                  "invalid_type")
    for key in ("name", "tool_call_id"):
        if m.get(key) is not None and not isinstance(m.get(key), str):
            raise bad(f"{p}.{key}", f"'{p}.{key}' must be a string", "invalid_type")
    return m


def _flatten(m: dict) -> dict:
    """A message with list-of-text-parts content joined into one string (what the chat template expects)."""
    c = m.get("content")
    if isinstance(c, list):
        m = {**m, "content": "".join(part["text"] for part in c)}
    return m


def check_messages(v: Any) -> list[dict]:
    if v is None:
        raise bad("messages", "'messages' is required", "missing_required_parameter")
    if not isinstance(v, list):
        raise bad("messages", f"'messages' must be an array, got {_kind(v)}", "invalid_type")
    if not v:
        raise bad("messages", "'messages' must not be empty")
    return [_flatten(_check_message(i, m)) for i, m in enumerate(v)]


def parse_chat(body: Mapping, info: ModelInfo) -> GenRequest:
    messages = check_messages(body.get("messages"))
    c = _common(body, "chat", info)
    kwargs = dict(get_dict(body, "chat_template_kwargs"))
    for reserved in ("messages", "tools", "add_generation_prompt"):
        if reserved in kwargs:
            raise bad(f"chat_template_kwargs.{reserved}", f"'chat_template_kwargs.{reserved}' cannot be set here")
    et = get_bool(kwargs, "enable_thinking", True, param="chat_template_kwargs.enable_thinking")
    kwargs["enable_thinking"] = et
    agp = get_bool(body, "add_generation_prompt", True)
    return GenRequest(kind="chat", messages=messages, chat_kwargs=kwargs, add_generation_prompt=bool(agp), **c)


def parse_completion(body: Mapping, info: ModelInfo) -> GenRequest:
    prompt = body.get("prompt")
    text: str | None = None
    ids: list[int] | None = None
    if prompt is None:
        raise bad("prompt", "'prompt' is required", "missing_required_parameter")
    if isinstance(prompt, list) and prompt and all(isinstance(p, (list, str)) for p in prompt):
        if len(prompt) != 1:
            raise bad("prompt", f"'prompt' holds {len(prompt)} prompts; one prompt per request is supported",
                      "unsupported_parameter")
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise bad("prompt", "'prompt' must not be empty")
        text = prompt
    elif isinstance(prompt, list):
        ids = check_token_ids(prompt, "prompt", info.vocab_size)
    else:
        raise bad("prompt", f"'prompt' must be a string or an array of token ids, got {_kind(prompt)}",
                  "invalid_type")
    c = _common(body, "completion", info)
    return GenRequest(kind="completion", prompt_text=text, prompt_ids=ids, **c)


def fit_context(req: GenRequest, prompt_len: int, info: ModelInfo) -> dict:
    """The request's sampling kwargs with max_tokens filled in; 400 context_length_exceeded when it cannot fit."""
    s = dict(req.sampling)
    if prompt_len == 0:
        raise bad(req.prompt_param, f"'{req.prompt_param}' is empty after tokenization")
    room = info.max_model_len - prompt_len
    if room < 1:
        raise ApiError(400, f"This model's maximum context length is {info.max_model_len} tokens. However, your "
                       f"prompt has {prompt_len} tokens, leaving no room for a completion.",
                       param=req.prompt_param, code="context_length_exceeded")
    if s["max_tokens"] is None:
        s["max_tokens"] = room
    elif s["max_tokens"] > room:
        raise ApiError(400, f"This model's maximum context length is {info.max_model_len} tokens. However, you "
                       f"requested {prompt_len + s['max_tokens']} tokens ({prompt_len} in the "
                       f"{req.prompt_param}, {s['max_tokens']} in the completion).",
                       param="max_tokens", code="context_length_exceeded")
    if s["min_tokens"] > s["max_tokens"]:
        s["min_tokens"] = s["max_tokens"]
    return s


def parse_tokenize(body: Mapping, info: ModelInfo) -> dict:
    """{'prompt': str | [ids]} or {'messages': [...]} (+ chat_template_kwargs, add_generation_prompt)."""
    if body.get("model") is not None:
        check_model(body, info)
    if "messages" in body and body.get("messages") is not None:
        kwargs = dict(get_dict(body, "chat_template_kwargs"))
        kwargs["enable_thinking"] = get_bool(kwargs, "enable_thinking", True,
                                             param="chat_template_kwargs.enable_thinking")
        return {"messages": check_messages(body["messages"]), "chat_kwargs": kwargs,
                "add_generation_prompt": bool(get_bool(body, "add_generation_prompt", True))}
    prompt = body.get("prompt")
    if prompt is None:
        raise bad("prompt", "'prompt' or 'messages' is required", "missing_required_parameter")
    if isinstance(prompt, str):
        return {"text": prompt}
    if isinstance(prompt, list):
        return {"ids": check_token_ids(prompt, "prompt", info.vocab_size, allow_empty=True)}
    raise bad("prompt", f"'prompt' must be a string or an array of token ids, got {_kind(prompt)}", "invalid_type")


def parse_detokenize(body: Mapping, info: ModelInfo) -> list[int]:
    if body.get("model") is not None:
        check_model(body, info)
    if body.get("tokens") is None:
        raise bad("tokens", "'tokens' is required", "missing_required_parameter")
    return check_token_ids(body["tokens"], "tokens", info.vocab_size, allow_empty=True)


# ---- replies ----------------------------------------------------------------------------------------------------

def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


@dataclasses.dataclass
class Reply:
    """What one finished request produced (filled by the app from the bridge's outputs)."""

    id: str
    model: str
    created: int
    prompt_ids: list[int]
    token_ids: list[int] = dataclasses.field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    cached_tokens: int = 0

    def usage(self) -> dict:
        return usage(len(self.prompt_ids), len(self.token_ids), self.cached_tokens)


def now() -> int:
    return int(time.time())


def chat_response(r: Reply, return_token_ids: bool) -> dict:
    choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": r.text},
                              "logprobs": None, "finish_reason": r.finish_reason}
    if return_token_ids:
        choice["token_ids"] = list(r.token_ids)
        choice["prompt_token_ids"] = list(r.prompt_ids)
    return {"id": r.id, "object": "chat.completion", "created": r.created, "model": r.model,
            "choices": [choice], "usage": r.usage(), "token_sha": token_sha(r.token_ids)}


def completion_response(r: Reply, return_token_ids: bool) -> dict:
    choice: dict[str, Any] = {"index": 0, "text": r.text, "logprobs": None, "finish_reason": r.finish_reason}
    if return_token_ids:
        choice["token_ids"] = list(r.token_ids)
        choice["prompt_token_ids"] = list(r.prompt_ids)
    return {"id": r.id, "object": "text_completion", "created": r.created, "model": r.model,
            "choices": [choice], "usage": r.usage(), "token_sha": token_sha(r.token_ids)}


def chunk(kind: str, r: Reply, *, text: str, token_ids: Sequence[int] | None = None, first: bool = False,
          finish_reason: str | None = None, prompt_ids: Sequence[int] | None = None) -> dict:
    """One streamed chunk: chat deltas (with `role` in the first) or completion text."""
    if kind == "chat":
        delta: dict[str, Any] = {"role": "assistant", "content": text} if first else {"content": text}
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        obj = "text_completion"
    if token_ids is not None:
        choice["token_ids"] = list(token_ids)
    out: dict[str, Any] = {"id": r.id, "object": obj, "created": r.created, "model": r.model, "choices": [choice]}
    if prompt_ids is not None:
        out["prompt_token_ids"] = list(prompt_ids)
    if finish_reason is not None:
        out["token_sha"] = token_sha(r.token_ids)
    return out


def usage_chunk(kind: str, r: Reply) -> dict:
    obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
    return {"id": r.id, "object": obj, "created": r.created, "model": r.model, "choices": [],
            "usage": r.usage()}


def models_response(info: ModelInfo, root: str, created: int) -> dict:
    return {"object": "list", "data": [{"id": info.served_id, "object": "model", "created": created,
                                        "owned_by": "cupyglm", "root": root, "parent": None,
                                        "max_model_len": info.max_model_len}]}
