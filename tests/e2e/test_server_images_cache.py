"""Image turns and the prompt cache, and remote image URLs, through the real server (`mpirun -n 2`, TP=2, numpy)
with the openai client: --vision-image-tokens resizes an image to fit; a resumed image conversation restores past
its image and equals a cold server's reply; another image in the same place misses; with --vision-urls a loopback
URL (the server's own) is a 400 naming the address, without it a 400 naming the flag; the server serving on."""
from __future__ import annotations

import openai
import pytest

from cupyglm.config import preset
from test_server_images import IMAGES, messages

pytestmark = pytest.mark.mpi
ARGS = ["--context", "512", "--parallel", "2", "--max-queue", "8", "--vision-image-tokens", "16"]


@pytest.fixture(scope="module")
def servers(start_server):
    kept = start_server([*ARGS, "--prompt-cache-gib", "0.02", "--vision-urls"])
    cold = start_server(ARGS)
    return (openai.OpenAI(base_url=kept.url, api_key="x", max_retries=0),
            openai.OpenAI(base_url=cold.url, api_key="x", max_retries=0), kept.port)


def chat(client, msgs):
    """(reply text, token ids, cached tokens, prompt token ids) of a greedy reply."""
    r = client.chat.completions.create(
        model=client.models.list().data[0].id, messages=msgs, max_tokens=8, temperature=0.0,
        extra_body={"return_token_ids": True, "ignore_eos": True, "chat_template_kwargs": {"enable_thinking": False}})
    d = r.model_dump(exclude_unset=True)
    c = d["choices"][0]
    return c["message"]["content"], c["token_ids"], d["usage"]["prompt_tokens_details"]["cached_tokens"], \
        c["prompt_token_ids"]


def second_turn(client, image):
    first = messages(image)
    text, _, _, _ = chat(client, first)
    return first + [{"role": "assistant", "content": text}, {"role": "user", "content": "And the colours?"}]


def test_resumed_image_turn_equals_a_cold_server(servers):
    kept, cold, _ = servers
    msgs = second_turn(kept, IMAGES[0])
    _, toks, cached, prompt = chat(kept, msgs)
    last = max(i for i, t in enumerate(prompt) if t == preset("tiny").vision.image_token_id)
    assert 0 < prompt.count(preset("tiny").vision.image_token_id) <= 16 < 24     # resized (24 rows uncapped)
    assert cached > last
    assert toks == chat(cold, msgs)[1]
    other = [dict(m) for m in msgs]
    other[0] = messages(IMAGES[1])[0]
    _, toks2, cached2, prompt2 = chat(kept, other)
    assert cached2 < prompt2.index(preset("tiny").vision.image_token_id) and toks2 == chat(cold, other)[1]


def test_remote_urls_refused_by_address_and_by_flag(servers):
    kept, cold, port = servers
    own = f"http://127.0.0.1:{port}/v1/models"
    for client, words in ((kept, "loopback"), (cold, "--vision-urls")):
        with pytest.raises(openai.BadRequestError) as e:
            chat(client, messages(own))
        err = e.value.body
        assert err["param"] == "messages[0].content[1].image_url" and words in err["message"], err
        assert len(chat(client, [{"role": "user", "content": "still serving?"}])[1]) == 8
