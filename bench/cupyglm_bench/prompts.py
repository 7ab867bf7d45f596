"""The fixed prompts, texts and conversations every run uses (so runs compare across servers and commits)."""
from __future__ import annotations

# decode: one raw-completion code prompt, one chat prompt (thinking off)
CODE_PROMPTS = [
    ("fibonacci-raw", 'def fibonacci(n):\n    """Return the n-th Fibonacci number, iteratively."""\n'),
    ("factorial-raw", 'def factorial(n):\n    """Return n! for a non-negative integer n."""\n'),
    ("is-prime-raw", 'def is_prime(n):\n    """Return True when n is a prime number."""\n'),
    ("gcd-raw", 'def gcd(a, b):\n    """Greatest common divisor by Euclid\'s algorithm."""\n'),
    ("quicksort-raw", 'def quicksort(xs):\n    """Sort a list of numbers; return a new list."""\n'),
    ("binary-search-raw", 'def binary_search(xs, target):\n    """Index of target in sorted xs, or -1."""\n'),
    ("flatten-raw", 'def flatten(nested):\n    """Flatten an arbitrarily nested list."""\n'),
    ("word-count-raw", 'def word_count(text):\n    """Count how often each word occurs in text."""\n'),
]

CHAT_PROMPTS = [
    ("gpu-chat-no-think", "Explain how a GPU hides memory latency, in a few short paragraphs."),
    ("kv-chat-no-think", "What is a KV cache in transformer inference, and why does it grow with context?"),
    ("tp-chat-no-think", "Describe tensor parallelism for a large language model to a new engineer."),
    ("sort-chat-no-think", "Compare merge sort and quicksort: speed, memory and stability."),
    ("tcp-chat-no-think", "How does TCP congestion control react to packet loss?"),
    ("cache-chat-no-think", "Why do CPUs have several levels of cache? Give concrete numbers."),
    ("raft-chat-no-think", "Summarize how the Raft consensus algorithm elects a leader."),
    ("hash-chat-no-think", "What makes a good hash function for a hash table?"),
]


def code_prompt(i: int) -> tuple[str, str]:
    name, text = CODE_PROMPTS[i % len(CODE_PROMPTS)]
    k = i // len(CODE_PROMPTS)
    return (name, text) if k == 0 else (f"{name}-{k}", f"# variant {k}\n{text}")


def chat_prompt(i: int) -> tuple[str, str]:
    name, text = CHAT_PROMPTS[i % len(CHAT_PROMPTS)]
    k = i // len(CHAT_PROMPTS)
    return (name, text) if k == 0 else (f"{name}-{k}", f"(Variant {k}.) {text}")


# cache / load: a fixed text, tokenized by the server, cycled to exact lengths
FIXED_TEXT = """\
Serving a large language model is mostly a memory problem. The weights are read once per decoding step, the
key-value cache grows with every token of context, and the prompt cache keeps the states of conversations that
may come back. A scheduler decides which requests run together: long prompts are prefilled in chunks so that
short requests are not starved, and decoding steps are batched so that the weights are read once for many
streams. Tensor parallelism splits every weight matrix across devices; each rank computes its shard and the
partial results are summed in a fixed order, so that the output does not depend on how many requests happen
to share a batch. Exactness means that the same request gives the same tokens whether it runs alone, next to
other requests, with speculative drafts or without them, from a fresh prefill or from a restored prompt state.
Benchmarks should measure what users feel: the time to the first token, the time between tokens, and how many
tokens per second the whole server produces under load. They should send token ids rather than text so that
prompt lengths are exact, salt or reset the prompt cache so that a warm cache does not flatter repeated runs,
and report percentiles rather than means alone, because the slowest requests are the ones people remember.
def merge(a, b):
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        if a[i] <= b[j]:
            out.append(a[i]); i += 1
        else:
            out.append(b[j]); j += 1
    return out + a[i:] + b[j:]
"""

# resume: a fixed conversation (thinking off, greedy, fixed max_tokens)
RESUME_SYSTEM = ("You are a careful assistant for systems engineers. Answer precisely and briefly. "
                 "Reference material follows.\n\n" + FIXED_TEXT)
RESUME_SYSTEM_SHORT = "You are a careful assistant for systems engineers. Answer precisely and briefly."
RESUME_TURNS = [
    "Summarize the reference material in three sentences.",
    "Which of those points matters most for exactness, and why?",
    "Write a short Python function that checks two token id lists are equal and returns the first difference.",
    "Now explain how you would test that function.",
    "What would change if the lists were streamed one token at a time?",
    "Give a one-line summary of this whole conversation.",
]
