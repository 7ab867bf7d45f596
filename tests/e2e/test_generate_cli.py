"""cupyglm-generate end to end: the real CLI process on the tiny checkpoint."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent


def _generate(*args, timeout=180):
    env = dict(os.environ)
    return subprocess.run([str(BIN / "cupyglm-generate"), *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


def test_generate_prints_the_same_text_every_run(tiny_dir):
    runs = [_generate("--prompt", "def fib(n):", "--max-tokens", "20", "--backend", "numpy") for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr
        assert "backend numpy; tp 1" in r.stderr
    assert runs[0].stdout == runs[1].stdout
    assert len(runs[0].stdout.strip()) > 0


def test_generate_chat_and_explicit_model_dir(tiny_dir):
    chat = _generate("--model", str(tiny_dir), "--prompt", "Hello", "--chat", "--max-tokens", "8")
    assert chat.returncode == 0, chat.stderr
    assert "prompt tokens" in chat.stderr


@pytest.mark.parametrize("args, needle", [
    (["--max-tokens", "0"], "--max-tokens"),
    (["--model", "/nonexistent/ckpt"], "/nonexistent/ckpt"),
    (["--backend", "tpu"], "backend"),
])
def test_generate_refuses_bad_input_by_name(tiny_dir, args, needle):
    r = _generate("--prompt", "x", *args)
    assert r.returncode != 0
    assert needle in r.stderr
    assert "Traceback" not in r.stderr


def test_backend_cuda_refuses_without_a_device_and_auto_says_numpy(tiny_dir):
    from cupyglm.backend import cuda_available

    if cuda_available():
        pytest.skip("a CUDA device is present")
    cuda = _generate("--prompt", "x", "--backend", "cuda", "--max-tokens", "2")
    assert cuda.returncode != 0
    assert "--backend cuda: no CUDA device" in cuda.stderr and "Traceback" not in cuda.stderr
    auto = _generate("--prompt", "x", "--backend", "auto", "--max-tokens", "2")
    assert auto.returncode == 0, auto.stderr
    assert "backend auto: no CUDA device, using numpy" in auto.stderr
