"""Validation of the OpenAI generation, tokenize and detokenize requests into what the engine runs.

Pure functions, no I/O: every check raises `ApiError` (cupyglm.server.errors) naming the offending field.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from cupyglm.server.errors import ApiError, bad
from cupyglm.server.fields import (check_token_ids, get_bool, get_dict, get_float, get_int, get_str, json_kind,
                                   short)
from cupyglm.server.glm_output import GlmOutput
from cupyglm.server.messages import check_messages, check_tools
from cupyglm.server.structured import structured_guide, tool_grammar
from cupyglm.server.thinking import apply_thinking
from cupyglm.server.unsupported import refuse_unsupported

MAX_STOP_STRINGS = 128
MAX_STOP_TOKEN_IDS = 64
MAX_STOP_CHARS = 4096
MAX_SEED = 2**64 - 1
MAX_INT32 = 2**31 - 1
MAX_TOP_LOGPROBS = 20
MAX_LOGIT_BIAS = 1024
MAX_N = 16                 # choices per prompt
MAX_PROMPTS = 64           # prompts in one completion request
MAX_CHOICES = 64           # prompts x n


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    """What validation needs to know about the served model."""

    served_id: str
    aliases: frozenset[str]          # names also accepted in `model` (checkpoint dir basename, path)
    max_model_len: int
    vocab_size: int
    prompt_cache: bool = False       # the engine keeps prompt states (cache_salt isolates them per tenant)
    mtp_drafts: int = 0              # --mtp-drafts: 0 refuses "draft": true (nothing would draft)
    vision_max_images: int = 0       # --vision-max-images while images are served; 0 refuses image parts


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
    prompts: list = dataclasses.field(default_factory=list)   # completion: each a text (str) or token ids
    n: int = 1                                  # choices per prompt (choice i: seed + i, see choice_seed)
    best_of: int = 1                            # candidates per prompt (>= n); the n best returned (server/best_of.py)
    continuous_usage: bool = False              # stream_options.continuous_usage_stats: usage on every chunk
    echo: bool = False                          # completion: the prompt's text (and logprobs) before the reply
    tools: list[dict] | None = None             # chat: the tools rendered and parsed (None: tool_choice none)
    parallel_tool_calls: bool = True            # chat: False = at most one call (the grammar or the parser)
    cache_salt: str | None = None               # kept prompt states are shared only under the same salt
    prompt_only: bool = False                   # completion echo with max_tokens 0: the prompt (and its logprobs)
    images: tuple = ()                          # chat: engine.images.ImageInput of the built prompt (gen_path)

    def glm_output(self) -> GlmOutput:
        """The parser of one chat reply: thinking as the template renders it, at most one call when not parallel."""
        return GlmOutput(bool(self.chat_kwargs.get("enable_thinking", True)), self.tools,
                         max_calls=None if self.parallel_tool_calls else 1)

    @property
    def per(self) -> int:
        """Engine requests per prompt: best_of candidates, or the n choices."""
        return max(self.n, self.best_of)

    @property
    def prompt_param(self) -> str:
        return "messages" if self.kind == "chat" else "prompt"

    @property
    def prompt_text(self) -> str | None:
        return self.prompts[0] if self.prompts and isinstance(self.prompts[0], str) else None

    @property
    def prompt_ids(self) -> list[int] | None:
        return self.prompts[0] if self.prompts and isinstance(self.prompts[0], list) else None


def choice_seed(seed: int | None, i: int) -> int | None:
    """The seed of choice i of a request with `seed`: seed + i (mod 2**64), so choice i's tokens equal those of
    the same request with n = 1 and that seed. No seed: each choice draws its own from the engine's sequence."""
    return None if seed is None else (seed + i) % (MAX_SEED + 1)


def check_model(body: Mapping, info: ModelInfo) -> str:
    name = body.get("model")
    if name is None:
        return info.served_id
    if not isinstance(name, str):
        raise bad("model", f"'model' must be a string, got {json_kind(name)}", "invalid_type")
    if name != info.served_id and name not in info.aliases:
        raise ApiError(404, f"The model '{short(name)}' does not exist; this server serves '{info.served_id}'",
                       param="model", code="model_not_found")
    return info.served_id


def _stop(body: Mapping) -> tuple[str, ...]:
    v = body.get("stop")
    if v is None:
        return ()
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list):
        raise bad("stop", f"'stop' must be a string or an array of strings, got {json_kind(v)}", "invalid_type")
    if len(v) > MAX_STOP_STRINGS:
        raise bad("stop", f"'stop' has {len(v)} strings; at most {MAX_STOP_STRINGS} are allowed")
    for i, s in enumerate(v):
        if not isinstance(s, str):
            raise bad("stop", f"'stop[{i}]' must be a string, got {json_kind(s)}", "invalid_type")
        if not s:
            raise bad("stop", f"'stop[{i}]' must not be empty")
        if len(s) > MAX_STOP_CHARS:
            raise bad("stop", f"'stop[{i}]' has {len(s)} characters; at most {MAX_STOP_CHARS} are allowed")
    return tuple(v)


def _logit_bias(body: Mapping, info: ModelInfo) -> tuple[tuple[int, float], ...]:
    """`logit_bias`: {"token id": bias in [-100, 100]}, at most MAX_LOGIT_BIAS ids."""
    lb = get_dict(body, "logit_bias")
    if len(lb) > MAX_LOGIT_BIAS:
        raise bad("logit_bias", f"'logit_bias' has {len(lb)} ids; at most {MAX_LOGIT_BIAS}")
    out = []
    for key, v in lb.items():
        p = f"logit_bias.{short(key)}"
        try:
            t = int(key)
        except ValueError:
            raise bad("logit_bias", f"'{p}': the keys of 'logit_bias' must be token ids") from None
        if not 0 <= t < info.vocab_size:
            raise bad("logit_bias", f"'{p}': {t} is not a token id of this model (0..{info.vocab_size - 1})",
                      "invalid_token_id")
        out.append((t, get_float(lb, key, 0.0, lo=-100.0, hi=100.0, param="logit_bias")))
    return tuple(sorted(out))


def _logprobs(body: Mapping, kind: str) -> int | None:
    """How many top ids to return with each token's logprob; None: no logprobs. Chat: `logprobs` true and
    `top_logprobs` 0..20; completions: `logprobs` 0..20."""
    if kind == "chat":
        top = get_int(body, "top_logprobs", None, lo=0, hi=MAX_TOP_LOGPROBS)
        if not get_bool(body, "logprobs", False):
            if top:
                raise bad("top_logprobs", "'top_logprobs' needs 'logprobs': true")
            return None
        return top or 0
    return get_int(body, "logprobs", None, lo=0, hi=MAX_TOP_LOGPROBS)


def _sampling(body: Mapping, info: ModelInfo, kind: str) -> dict:
    max_tokens = get_int(body, "max_tokens", None, lo=0 if kind == "completion" else 1)
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
    lp = _logprobs(body, kind)
    plp = get_int(body, "prompt_logprobs", None, lo=0, hi=MAX_TOP_LOGPROBS)
    if kind == "completion" and get_bool(body, "echo", False) and lp is not None:
        plp = max(lp, plp or 0)                 # echo with logprobs: the prompt's tokens carry them too
    guide = structured_guide(body)
    if guide is not None and (ignore_eos or min_tokens):
        name = "ignore_eos" if ignore_eos else "min_tokens"
        raise bad(name, f"'{name}' cannot be combined with structured output (EOS ends the match)")
    return dict(logprobs=lp, prompt_logprobs=plp, logit_bias=_logit_bias(body, info), guide=guide,
                presence_penalty=get_float(body, "presence_penalty", 0.0, lo=-2.0, hi=2.0),
                frequency_penalty=get_float(body, "frequency_penalty", 0.0, lo=-2.0, hi=2.0),
                repetition_penalty=get_float(body, "repetition_penalty", 1.0, lo=0.0, hi=10.0, lo_open=True),
                temperature=temperature, top_p=top_p, top_k=max(top_k, 0), min_p=min_p, seed=seed,
                max_tokens=max_tokens, min_tokens=min_tokens, stop=_stop(body), stop_token_ids=stop_ids,
                ignore_eos=ignore_eos, skip_special_tokens=skip_special,
                draft=_draft(body, info))


def _draft(body: Mapping, info: ModelInfo) -> bool | None:
    """"draft": None follows the server's --mtp-drafts; true on a server that drafts nothing is refused."""
    draft = get_bool(body, "draft", None)
    if draft and not info.mtp_drafts:
        raise bad("draft", "'draft': true needs a server started with --mtp-drafts N (this one drafts nothing); "
                  "send false or leave it out", "unsupported_parameter")
    return draft


def _common(body: Mapping, kind: str, info: ModelInfo) -> dict:
    model = check_model(body, info)
    refuse_unsupported(body, kind)
    salt = _cache_salt(body)
    stream = get_bool(body, "stream", False)
    so = body.get("stream_options")
    include_usage = continuous = False
    if so is not None:
        if not isinstance(so, dict):
            raise bad("stream_options", f"'stream_options' must be an object, got {json_kind(so)}", "invalid_type")
        if not stream:
            raise bad("stream_options", "'stream_options' is only allowed when 'stream' is true")
        include_usage = bool(get_bool(so, "include_usage", False, param="stream_options.include_usage"))
        continuous = bool(get_bool(so, "continuous_usage_stats", False, param="stream_options.continuous_usage_stats"))
        get_bool(so, "include_obfuscation", False, param="stream_options.include_obfuscation")
    n = get_int(body, "n", 1, lo=1, hi=MAX_N)
    best_of = get_int(body, "best_of", n, lo=1, hi=MAX_N)
    if best_of < n:
        raise bad("best_of", f"'best_of' = {best_of} must be at least 'n' = {n}")
    if best_of > n and stream:
        raise bad("best_of", "'best_of' greater than 'n' cannot be streamed")
    return dict(model=model, stream=stream, include_usage=include_usage, n=n, best_of=best_of, cache_salt=salt,
                continuous_usage=include_usage and continuous,
                return_token_ids=bool(get_bool(body, "return_token_ids", False)),
                sampling=_sampling(body, info, kind))


def _cache_salt(body: Mapping) -> str | None:
    """A salt isolates kept prompt states: a request restores only states kept under its own salt."""
    salt = get_str(body, "cache_salt")
    if salt is not None and not salt:
        raise bad("cache_salt", "'cache_salt' must not be empty")
    return salt


def _chat_template_kwargs(body: Mapping, reserved: tuple[str, ...] = ()) -> dict:
    kwargs = dict(get_dict(body, "chat_template_kwargs"))
    for name in reserved:
        if name in kwargs:
            raise bad(f"chat_template_kwargs.{name}", f"'chat_template_kwargs.{name}' cannot be set here")
    kwargs["enable_thinking"] = get_bool(kwargs, "enable_thinking", True,
                                         param="chat_template_kwargs.enable_thinking")
    return kwargs


def _bad_prompt_type(prompt: object) -> ApiError:
    return bad("prompt", f"'prompt' must be a string or an array of token ids, got {json_kind(prompt)}",
               "invalid_type")


def parse_chat(body: Mapping, info: ModelInfo) -> GenRequest:
    messages = check_messages(body.get("messages"), info.vision_max_images)
    c = _common(body, "chat", info)
    kwargs = _chat_template_kwargs(body, reserved=("messages", "tools", "add_generation_prompt"))
    apply_thinking(body, kwargs)
    agp = get_bool(body, "add_generation_prompt", True)
    tools = check_tools(body)
    if tools:
        kwargs["tools"] = tools
    parallel = get_bool(body, "parallel_tool_calls", True)
    tool_grammar(c["sampling"], tools, body.get("tool_choice"), parallel, kwargs["enable_thinking"])
    return GenRequest(kind="chat", messages=messages, chat_kwargs=kwargs, add_generation_prompt=bool(agp),
                      tools=tools, parallel_tool_calls=parallel, **c)


def parse_completion(body: Mapping, info: ModelInfo) -> GenRequest:
    prompt = body.get("prompt")
    if prompt is None:
        raise bad("prompt", "'prompt' is required", "missing_required_parameter")
    if isinstance(prompt, list) and prompt and all(isinstance(p, (list, str)) for p in prompt):
        if len(prompt) > MAX_PROMPTS:
            raise bad("prompt", f"'prompt' holds {len(prompt)} prompts; at most {MAX_PROMPTS} per request")
        prompts = [_one_prompt(p, f"prompt[{i}]", info) for i, p in enumerate(prompt)]
    else:
        prompts = [_one_prompt(prompt, "prompt", info)]
    c = _common(body, "completion", info)
    per = max(c["n"], c["best_of"])
    if len(prompts) * per > MAX_CHOICES:
        name = "n" if per == c["n"] else "best_of"
        raise bad(name, f"{len(prompts)} prompts x {name} = {per} asks for {len(prompts) * per} choices; at most "
                  f"{MAX_CHOICES} per request")
    echo = bool(get_bool(body, "echo", False))
    prompt_only = c["sampling"]["max_tokens"] == 0
    if prompt_only:
        if not echo:
            raise bad("max_tokens", "'max_tokens' = 0 is allowed only with 'echo': true (the prompt's logprobs)")
        c["sampling"].update(max_tokens=1, min_tokens=0)   # the engine runs one step; its token is dropped
    return GenRequest(kind="completion", prompts=prompts, echo=echo, prompt_only=prompt_only, **c)


def _one_prompt(prompt: object, param: str, info: ModelInfo) -> str | list[int]:
    if isinstance(prompt, str):
        if not prompt:
            raise bad("prompt", f"'{param}' must not be empty")
        return prompt
    if isinstance(prompt, list):
        return check_token_ids(prompt, "prompt", info.vocab_size)
    raise _bad_prompt_type(prompt)


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
        kwargs = _chat_template_kwargs(body)
        return {"messages": check_messages(body["messages"]), "chat_kwargs": kwargs,
                "add_generation_prompt": bool(get_bool(body, "add_generation_prompt", True))}
    prompt = body.get("prompt")
    if prompt is None:
        raise bad("prompt", "'prompt' or 'messages' is required", "missing_required_parameter")
    if isinstance(prompt, str):
        return {"text": prompt}
    if isinstance(prompt, list):
        return {"ids": check_token_ids(prompt, "prompt", info.vocab_size, allow_empty=True)}
    raise _bad_prompt_type(prompt)


def parse_detokenize(body: Mapping, info: ModelInfo) -> list[int]:
    if body.get("model") is not None:
        check_model(body, info)
    if body.get("tokens") is None:
        raise bad("tokens", "'tokens' is required", "missing_required_parameter")
    return check_token_ids(body["tokens"], "tokens", info.vocab_size, allow_empty=True)
