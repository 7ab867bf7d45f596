"""Big bodies parsed in the child process: the same answers and refusals as in-process parsing."""
from __future__ import annotations

import json

import pytest

from cupyglm.server.errors import ApiError
from cupyglm.server.fields import parse_json_object
from cupyglm.server.jsonproc import JsonProcess


def test_child_parses_like_the_server_and_refuses_by_name():
    j = JsonProcess()
    try:
        body = json.dumps({"prompt": "x" * 300_000, "max_tokens": 3}).encode()
        assert j.parse(body) == parse_json_object(body)
        for raw, param in ((b'{"prompt":"a\\ud800"}', "prompt"), (b'{"a":1,"a":2}', "a"),
                           (b'{"p":' + b"[" * 2000 + b"]" * 2000 + b"}", None), (b"[1]", None)):
            with pytest.raises(ApiError) as e:
                j.parse(raw)
            assert e.value.status == 400 and e.value.param == param
        proc = j._proc
    finally:
        j.close()
    assert proc.poll() is not None, "the child outlived close()"
