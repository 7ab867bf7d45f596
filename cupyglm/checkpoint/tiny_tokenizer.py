"""The tiny checkpoint's tokenizer: the 256-byte alphabet, BPE merges learned from a fixed built-in text, the
GLM special tokens at the top ids and the image/video tokens in place of four learned merges; plus its
tokenizer_config.json (with the GLM chat template) and eos ids."""
from __future__ import annotations

import json

import tokenizers
from tokenizers import AddedToken, decoders, models, pre_tokenizers, processors, trainers

from cupyglm.checkpoint.chat_template import GLM_CHAT_TEMPLATE

# ---- GLM special tokens ------------------------------------------------------------------------------
# In GLM-4.5 order. The last four are added tokens that are not "special": they survive
# skip_special_tokens so reasoning and tool-call parsers can see them.
SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>",
    "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>",
    "<|begin_of_image|>", "<|end_of_image|>",
)
PLAIN_ADDED_TOKENS: tuple[str, ...] = ("<think>", "</think>", "<tool_call>", "</tool_call>")
ADDED_TOKENS: tuple[str, ...] = SPECIAL_TOKENS + PLAIN_ADDED_TOKENS
EOS_TOKENS: tuple[str, ...] = ("<|endoftext|>", "<|user|>", "<|observation|>")   # as GLM-4.5
# The image and video tokens (special), each taking the id of a learned merge that no later merge builds on and
# that no test or bench prompt spells: every other id, and the tokens of any text without these words, stay put.
VISION_TOKENS: dict[str, str] = {
    "<|begin_of_video|>": "ĠBY", "<|end_of_video|>": "Ġargc", "<|image|>": "Ġbegin", "<|video|>": "Ġlived",
}
TINY_VOCAB_SIZE = 512
TINY_MODEL_MAX_LENGTH = 131072


_TRAINING_TEXT = r'''
The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single step.
It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of
foolishness. In the beginning there was nothing, and then there was a model that could read and write.
The server receives a request, tokenizes the prompt, and streams the answer back to the user one token at
a time. Every sentence here is part of a small, fixed training text so that the merges never change.
What is the capital of France? The capital of France is Paris. How are you today? I am fine, thank you.
Please answer the question below with a short explanation, and then give the final answer on its own line.
Hello world! Good morning, good evening, and good night. Once upon a time, in a land far away, there lived
a king and a queen who had three children. They were happy, and they lived there for many years.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 100 256 512 1024 2048 4096 65536 3.14159 2.71828 -1 +1 = == != <= >=
The weather is nice and the sky is blue. Water boils at one hundred degrees. The earth turns around the sun.
System messages set the rules; user messages ask; assistant messages answer; tool messages return results.

def fibonacci(n):
    """Return the n-th Fibonacci number."""
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


class Request:
    def __init__(self, prompt, max_tokens=16, temperature=0.0):
        self.prompt = prompt
        self.max_tokens = max_tokens
        self.temperature = temperature

    def __repr__(self):
        return f"Request(prompt={self.prompt!r}, max_tokens={self.max_tokens})"


import json
import numpy as np

def softmax(x):
    x = np.asarray(x, dtype=np.float32)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)

if __name__ == "__main__":
    print(json.dumps({"result": fibonacci(10), "ok": True}))

#include <stdio.h>
int main(int argc, char **argv) {
    for (int i = 0; i < argc; i++) {
        printf("%d: %s\n", i, argv[i]);
    }
    return 0;
}

function add(a, b) { return a + b; }
const items = [1, 2, 3].map((x) => x * 2);
SELECT name, count(*) FROM users WHERE active = true GROUP BY name ORDER BY name;
'''


def build_tiny_tokenizer(vocab_size: int = TINY_VOCAB_SIZE) -> tokenizers.Tokenizer:
    """A byte-level BPE of exactly `vocab_size` ids: the 256-byte alphabet, merges trained on a fixed text,
    then the GLM added tokens at the top ids. Deterministic."""
    n_base = vocab_size - len(ADDED_TOKENS)
    if n_base < 256:
        raise ValueError(f"vocab_size {vocab_size} leaves no room for the 256-byte alphabet")
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=n_base, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    lines = [ln for ln in _TRAINING_TEXT.splitlines(keepends=True)]
    tok.train_from_iterator(lines * 2, trainer=trainer)
    if tok.get_vocab_size() != n_base:
        raise RuntimeError(f"tiny tokenizer training produced {tok.get_vocab_size()} ids, wanted {n_base}")
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in PLAIN_ADDED_TOKENS])
    if tok.get_vocab_size(with_added_tokens=True) != vocab_size:
        raise RuntimeError(f"tiny tokenizer has {tok.get_vocab_size(with_added_tokens=True)} ids, wanted {vocab_size}")
    for i, t in enumerate(ADDED_TOKENS):
        assert tok.token_to_id(t) == n_base + i, t
    return _with_vision_tokens(tok, vocab_size)


def _with_vision_tokens(tok: tokenizers.Tokenizer, vocab_size: int) -> tokenizers.Tokenizer:
    """`tok` with each VISION_TOKENS merge dropped and its vocabulary entry renamed to the image/video token, which
    is then added (an added token already in the model's vocabulary keeps that id)."""
    body = json.loads(tok.to_str())
    vocab, merges = body["model"]["vocab"], body["model"]["merges"]
    pair = (lambda m: "".join(m)) if merges and isinstance(merges[0], list) else (lambda m: m.replace(" ", ""))
    for token, word in VISION_TOKENS.items():
        if word not in vocab or any(word in pair(m) and pair(m) != word for m in merges):
            raise RuntimeError(f"tiny tokenizer: {word!r} is not a leaf merge; pick another id for {token}")
        tid = vocab[token] = vocab.pop(word)
        merges[:] = [m for m in merges if pair(m) != word]
        body["added_tokens"].append({"id": tid, "content": token, "single_word": False, "lstrip": False,
                                     "rstrip": False, "normalized": False, "special": True})
    body["added_tokens"].sort(key=lambda a: a["id"])
    out = tokenizers.Tokenizer.from_str(json.dumps(body))
    if out.get_vocab_size(with_added_tokens=True) != vocab_size or any(
            out.token_to_id(a["content"]) != a["id"] for a in body["added_tokens"]):
        raise RuntimeError(f"tiny tokenizer: the added tokens did not keep their ids (vocab {vocab_size})")
    return out


def vision_token_ids(tok: tokenizers.Tokenizer) -> dict[str, int]:
    """The image and video token ids by their config.json field names."""
    names = {"image_token_id": "<|image|>", "video_token_id": "<|video|>",
             "image_start_token_id": "<|begin_of_image|>", "image_end_token_id": "<|end_of_image|>",
             "video_start_token_id": "<|begin_of_video|>", "video_end_token_id": "<|end_of_video|>"}
    return {field: tok.token_to_id(t) for field, t in names.items()}


def tiny_tokenizer_config(tok: tokenizers.Tokenizer, model_max_length: int = TINY_MODEL_MAX_LENGTH) -> dict:
    """tokenizer_config.json for the tiny tokenizer (Hugging Face layout)."""
    decoder = {}
    for t in sorted(ADDED_TOKENS + tuple(VISION_TOKENS), key=tok.token_to_id):
        decoder[str(tok.token_to_id(t))] = {
            "content": t, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
            "special": t in SPECIAL_TOKENS or t in VISION_TOKENS,
        }
    return {
        "added_tokens_decoder": decoder,
        "additional_special_tokens": list(SPECIAL_TOKENS[1:]) + list(VISION_TOKENS),
        "bos_token": None,
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "do_lower_case": False,
        "model_max_length": model_max_length,
        "padding_side": "left",
        "remove_space": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": GLM_CHAT_TEMPLATE,
    }


def tiny_eos_token_ids(tok: tokenizers.Tokenizer) -> tuple[int, ...]:
    return tuple(tok.token_to_id(t) for t in EOS_TOKENS)
