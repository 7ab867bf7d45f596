"""The real server against hostile input and slow clients: every malformed body a 4xx in the OpenAI error shape
with no traceback in the log and the answers unchanged after; read deadlines cut slow clients."""
from __future__ import annotations

import socket
import threading
import time

import httpx
import pytest

pytestmark = pytest.mark.mpi

C, CH, TK, DT = "/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"
MSG = '[{"role":"user","content":"hi"}]'
HEAD_S, BODY_S = 2.0, 3.0
DEEP = 1200
BIG_INT = "9" * 400

# (name, path, raw body, expected status, content type); bodies are raw bytes so every malformation reaches the wire
HOSTILE: list[tuple[str, str, bytes, int, str]] = [
    ("nested arrays 1200", C, b'{"prompt":' + b"[" * DEEP + b"]" * DEEP + b"}", 400, ""),
    ("nested objects 1200", C, b'{"prompt":' + b'{"a":' * DEEP + b"1" + b"}" * DEEP + b"}", 400, ""),
    ("nested messages 1200", CH, b'{"messages":' + b"[" * DEEP + b"]" * DEEP + b"}", 400, ""),
    ("nested tokenize 1200", TK, b'{"prompt":' + b"[" * DEEP + b"]" * DEEP + b"}", 400, ""),
    ("nested 40 in kwargs", CH, b'{"messages":' + MSG.encode() + b',"chat_template_kwargs":{"x":'
     + b"[" * 40 + b"]" * 40 + b"}}", 400, ""),
    ("unclosed nesting", C, b'{"prompt":' + b"[" * 5000, 400, ""),
    ("400-digit temperature", C, b'{"prompt":"x","temperature":' + BIG_INT.encode() + b"}", 400, ""),
    ("400-digit top_p", C, b'{"prompt":"x","top_p":-' + BIG_INT.encode() + b"}", 400, ""),
    ("400-digit min_p", C, b'{"prompt":"x","min_p":' + BIG_INT.encode() + b"}", 400, ""),
    ("400-digit presence_penalty", C, b'{"prompt":"x","presence_penalty":' + BIG_INT.encode() + b"}", 400, ""),
    ("400-digit repetition_penalty", C, b'{"prompt":"x","repetition_penalty":' + BIG_INT.encode() + b"}", 400,
     ""),
    ("400-digit max_tokens", C, b'{"prompt":"x","max_tokens":' + BIG_INT.encode() + b"}", 400, ""),
    ("400-digit seed", C, b'{"prompt":"x","seed":' + BIG_INT.encode() + b"}", 400, ""),
    ("400-digit top_k", C, b'{"prompt":"x","top_k":' + BIG_INT.encode() + b"}", 400, ""),
    ("400-digit n", C, b'{"prompt":"x","n":' + BIG_INT.encode() + b"}", 400, ""),
    ("400-digit token id", C, b'{"prompt":[' + BIG_INT.encode() + b"]}", 400, ""),
    ("5000-digit integer", C, b'{"prompt":"x","seed":' + b"7" * 5000 + b"}", 400, ""),
    ("1e400 temperature", C, b'{"prompt":"x","temperature":1e400}', 400, ""),
    ("-1e400 top_p", C, b'{"prompt":"x","top_p":-1e400}', 400, ""),
    ("1e400 max_tokens", C, b'{"prompt":"x","max_tokens":1e400}', 400, ""),
    ("NaN temperature", C, b'{"prompt":"x","temperature":NaN}', 400, ""),
    ("Infinity top_p", C, b'{"prompt":"x","top_p":Infinity}', 400, ""),
    ("-Infinity min_p", C, b'{"prompt":"x","min_p":-Infinity}', 400, ""),
    ("float token id", C, b'{"prompt":[1.5]}', 400, ""),
    ("surrogate in prompt", C, b'{"prompt":"a\\ud800b"}', 400, ""),
    ("low surrogate in prompt", C, b'{"prompt":"a\\udfffb"}', 400, ""),
    ("surrogate in message", CH, b'{"messages":[{"role":"user","content":"a\\ud800b"}]}', 400, ""),
    ("surrogate in text part", CH, b'{"messages":[{"role":"user","content":[{"type":"text","text":"\\udc00"}]}]}',
     400, ""),
    ("surrogate in role", CH, b'{"messages":[{"role":"\\ud800","content":"x"}]}', 400, ""),
    ("surrogate in name", CH, b'{"messages":[{"role":"user","content":"x","name":"\\ud800"}]}', 400, ""),
    ("surrogate in tokenize", TK, b'{"prompt":"a\\ud800b"}', 400, ""),
    ("surrogate in tokenize messages", TK, b'{"messages":[{"role":"user","content":"\\ud800"}]}', 400, ""),
    ("surrogate in model", C, b'{"model":"\\ud800","prompt":"x"}', 400, ""),
    ("surrogate in stop", C, b'{"prompt":"x","stop":["\\ud800"]}', 400, ""),
    ("surrogate in key", C, b'{"prompt":"x","\\ud800":1}', 400, ""),
    ("surrogate in kwargs", CH, b'{"messages":' + MSG.encode() + b',"chat_template_kwargs":{"k":"\\ud800"}}', 400,
     ""),
    ("raw NUL in string", C, b'{"prompt":"a\x00b"}', 400, ""),
    ("raw NUL outside", C, b'{"prompt":"x"}\x00', 400, ""),
    ("NUL in model", C, b'{"model":"a\\u0000b","prompt":"x"}', 404, ""),
    ("invalid utf-8", C, b'{"prompt":"\xff\xfe"}', 400, ""),
    ("overlong utf-8", C, b'{"prompt":"\xc0\xaf"}', 400, ""),
    ("empty body", C, b"", 400, ""),
    ("whitespace body", C, b"   \n", 400, ""),
    ("null body", C, b"null", 400, ""),
    ("array body", C, b"[1,2]", 400, ""),
    ("string body", CH, b'"hello"', 400, ""),
    ("truncated json", C, b'{"prompt":"x"', 400, ""),
    ("trailing garbage", C, b'{"prompt":"x"} xyz', 400, ""),
    ("single quotes", C, b"{'prompt':'x'}", 400, ""),
    ("duplicate key", C, b'{"prompt":"x","prompt":"y"}', 400, ""),
    ("duplicate nested key", CH, b'{"messages":[{"role":"user","role":"system","content":"x"}]}', 400, ""),
    ("form content-type", C, b"prompt=x", 415, "application/x-www-form-urlencoded"),
    ("text content-type", C, b'{"prompt":"x"}', 415, "text/plain"),
    ("multipart content-type", CH, b'{"messages":[]}', 415, "multipart/form-data; boundary=x"),
    ("prompt object", C, b'{"prompt":{"a":1}}', 400, ""),
    ("prompt number", C, b'{"prompt":5}', 400, ""),
    ("prompt bool", C, b'{"prompt":true}', 400, ""),
    ("prompt empty", C, b'{"prompt":""}', 400, ""),
    ("prompt ids mixed", C, b'{"prompt":[1,"a"]}', 400, ""),
    ("prompt ids nested deeper", C, b'{"prompt":[[1],[[2]]]}', 400, ""),
    ("messages object", CH, b'{"messages":{"role":"user"}}', 400, ""),
    ("messages string", CH, b'{"messages":"hi"}', 400, ""),
    ("message number", CH, b'{"messages":[5]}', 400, ""),
    ("role number", CH, b'{"messages":[{"role":1,"content":"x"}]}', 400, ""),
    ("content object", CH, b'{"messages":[{"role":"user","content":{"a":1}}]}', 400, ""),
    ("part not object", CH, b'{"messages":[{"role":"user","content":["x"]}]}', 400, ""),
    ("part text number", CH, b'{"messages":[{"role":"user","content":[{"type":"text","text":5}]}]}', 400, ""),
    ("stream string", C, b'{"prompt":"x","stream":"yes"}', 400, ""),
    ("stream_options array", C, b'{"prompt":"x","stream":true,"stream_options":[]}', 400, ""),
    ("include_usage number", C, b'{"prompt":"x","stream":true,"stream_options":{"include_usage":1}}', 400, ""),
    ("return_token_ids string", C, b'{"prompt":"x","return_token_ids":"t"}', 400, ""),
    ("temperature string", C, b'{"prompt":"x","temperature":"0.5"}', 400, ""),
    ("top_k float", C, b'{"prompt":"x","top_k":1.5}', 400, ""),
    ("seed string", C, b'{"prompt":"x","seed":"1"}', 400, ""),
    ("stop object", C, b'{"prompt":"x","stop":{"a":1}}', 400, ""),
    ("stop empty string", C, b'{"prompt":"x","stop":[""]}', 400, ""),
    ("stop_token_ids string", C, b'{"prompt":"x","stop_token_ids":"1"}', 400, ""),
    ("logit_bias array", C, b'{"prompt":"x","logit_bias":[1]}', 400, ""),
    ("response_format string", CH, b'{"messages":' + MSG.encode() + b',"response_format":"json"}', 400, ""),
    ("tools object", CH, b'{"messages":' + MSG.encode() + b',"tools":{"a":1}}', 400, ""),
    ("kwargs array", CH, b'{"messages":' + MSG.encode() + b',"chat_template_kwargs":[1]}', 400, ""),
    ("add_generation_prompt string", CH, b'{"messages":' + MSG.encode() + b',"add_generation_prompt":"no"}', 400,
     ""),
    ("model array", C, b'{"model":["a"],"prompt":"x"}', 400, ""),
    ("huge model name", C, b'{"model":"' + b"m" * 30000 + b'","prompt":"x"}', 404, ""),
    ("huge stop string", C, b'{"prompt":"x","stop":["' + b"s" * 30000 + b'"]}', 400, ""),
    ("huge prompt", C, b'{"prompt":"' + b"p" * 60000 + b'","max_tokens":2}', 400, ""),
    ("over body limit", C, b'{"prompt":"' + b"p" * 70000 + b'"}', 413, ""),
    ("tokenize prompt object", TK, b'{"prompt":{}}', 400, ""),
    ("tokenize huge text", TK, b'{"prompt":"' + b"t" * 60000 + b'"}', 400, ""),
    ("detokenize string", DT, b'{"tokens":"1 2"}', 400, ""),
    ("detokenize negative", DT, b'{"tokens":[-1]}', 400, ""),
    ("detokenize 400-digit", DT, b'{"tokens":[' + BIG_INT.encode() + b"]}", 400, ""),
    ("detokenize missing", DT, b"{}", 400, ""),
    ("trailing slash route", C + "/", b'{"prompt":"x"}', 404, ""),
    ("trailing slash models", "/v1/models/", b"", 404, ""),
]


@pytest.fixture(scope="module")
def server(start_server, server_args):
    s = start_server([*server_args, "--read-timeout", str(HEAD_S), "--body-timeout", str(BODY_S)])
    yield s
    s.kill()


def _post(http: httpx.Client, path: str, body: bytes, ctype: str) -> httpx.Response:
    if path == "/v1/models/":
        return http.get(path)
    return http.post(path, content=body, headers={"Content-Type": ctype or "application/json"})


def _greedy(http: httpx.Client) -> list[int]:
    r = http.post(C, json={"prompt": "Once upon", "max_tokens": 8, "temperature": 0, "ignore_eos": True,
                           "return_token_ids": True})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["token_ids"]


def test_hostile_bodies_are_4xx_and_change_nothing(server):
    assert len(HOSTILE) >= 60
    with httpx.Client(base_url=server.base, timeout=60, follow_redirects=False) as http:
        before = _greedy(http)
        failures = []
        for name, path, body, status, ctype in HOSTILE:
            r = _post(http, path, body, ctype)
            try:
                err = r.json()["error"]
                ok = (r.status_code == status and isinstance(err["message"], str) and err["message"]
                      and err["type"] and "code" in err and "param" in err and len(r.content) < 2000)
            except Exception:  # noqa: BLE001 - a reply that is not the error shape is a failure
                ok, err = False, r.text[:300]
            if not ok:
                failures.append(f"{name}: {r.status_code} {err}")
        assert not failures, "\n".join(failures)
        assert _greedy(http) == before
        assert http.get("/health").json() == {"status": "ok"}
    assert "Traceback" not in server.output and "Exception" not in server.output, server.output[-3000:]


def test_control_token_text_in_content_is_plain_text(server):
    with httpx.Client(base_url=server.base, timeout=60) as http:
        special = http.post(TK, json={"prompt": "<|assistant|>"}).json()["tokens"]
        assert len(special) == 1                      # a completion prompt keeps control tokens
        plain = http.post(TK, json={"messages": [{"role": "user", "content": "hi<|assistant|>"}]}).json()["tokens"]
        marked = http.post(TK, json={"messages": [{"role": "user", "content": "hi"}]}).json()["tokens"]
        assert plain.count(special[0]) == marked.count(special[0])       # only the template's own


# ---- slow clients -----------------------------------------------------------------------------------------------

def _open(server) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=60)


def _closed_after(sock: socket.socket) -> float:
    """Seconds until the server closes `sock` (reads until EOF)."""
    t0 = time.monotonic()
    try:
        while sock.recv(65536):
            pass
    except OSError:
        pass
    return time.monotonic() - t0


SLOW = {
    "idle socket": b"",
    "partial headers": b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Ty",
    "endless chunked body": b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                            b"Transfer-Encoding: chunked\r\n\r\n5\r\n{\"pro\r\n",
    "short body": b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100\r\n\r\n{\"prompt\":",
}


def test_slow_clients_are_cut_and_do_not_stop_service(server):
    socks = []
    for i in range(64):
        s = _open(server)
        s.sendall(list(SLOW.values())[i % 4])
        socks.append(s)
    probes = {name: _open(server) for name in SLOW}
    for name, s in probes.items():
        s.sendall(SLOW[name])
    with httpx.Client(base_url=server.base, timeout=30) as http:
        t0 = time.monotonic()
        assert len(_greedy(http)) == 8                 # served while 68 slow clients hold sockets
        served = time.monotonic() - t0
    took: dict[str, float] = {}
    threads = [threading.Thread(target=lambda n=n, s=s: took.__setitem__(n, _closed_after(s)))
               for n, s in probes.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(BODY_S + 20)
    for s in socks + list(probes.values()):
        s.close()
    print(f"normal request served in {served:.2f} s beside 64 slow clients; cut after: "
          + ", ".join(f"{n} {t:.1f} s" for n, t in took.items()))
    assert served < 10
    for name in ("idle socket", "partial headers"):
        assert took[name] < HEAD_S + 3, (name, took)
    for name in ("endless chunked body", "short body"):
        assert took[name] < BODY_S + 3, (name, took)
