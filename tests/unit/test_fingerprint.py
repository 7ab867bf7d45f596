"""The rank-settings fingerprint: contents, comparison lines, decisions over gathered payloads."""
from __future__ import annotations

import dataclasses
import hashlib
import json

import pytest

from cupyglm.distributed import fingerprint as fp
from cupyglm.settings import SOURCES, Settings, SettingsError


def test_model_identity_hashes_config_bytes_only(tmp_path):
    (tmp_path / "config.json").write_bytes(b'{"a": 1}')
    (tmp_path / "model.safetensors").write_bytes(b"x" * 10)
    assert fp.model_identity(tmp_path) == hashlib.sha256(b'{"a": 1}').hexdigest()
    (tmp_path / "model.safetensors").write_bytes(b"y")
    assert fp.model_identity(tmp_path) == hashlib.sha256(b'{"a": 1}').hexdigest()
    assert fp.model_identity(None) == "builtin-tiny"


def test_model_identity_missing(tmp_path):
    with pytest.raises(SettingsError, match=r"--model .*: no config.json there"):
        fp.model_identity(tmp_path)


def test_fingerprint_holds_every_agreed_setting():
    f = fp.fingerprint(Settings(kv_host=True, kv_host_shared=True), backend="numpy")
    assert f["version"] == fp.VERSION == 5
    assert set(f) == {"version", *fp.FIELDS}
    assert f["model"] == "builtin-tiny" and f["backend"] == "numpy"
    assert f["arithmetic"] == "arithmetic 3, tensor core sm_90"
    assert f["kv_host"] == 2 and "kv_host_shared" not in f
    assert all(k in SOURCES or k in fp.HOW for k in fp.FIELDS)
    json.dumps(f)  # plain JSON values


def test_fingerprint_uses_model_id_when_filled():
    s = dataclasses.replace(Settings(model="/nowhere"), model_id="abc")
    assert fp.fingerprint(s)["model"] == "abc"


def test_every_settings_field_but_per_rank_ones_is_fingerprinted():
    fields = {f.name for f in dataclasses.fields(Settings)}
    # model_id is "model"; shared is inside kv_host; the disk directory differs per host (prompt_cache_disk: set or not);
    # cuda graphs replay the eager call's bits, so ranks may differ in them
    covered = set(fp.FIELDS) - {"prompt_cache_disk", "arithmetic"} | {"model_id", "kv_host_shared", "prompt_cache_dir",
                                                                      "cuda_graphs"}
    assert fields == covered


def base(**kw):
    return fp.fingerprint(Settings(**kw), backend="numpy")


def test_compare_equal():
    assert fp.compare([base(), base(), base()]) is None
    assert fp.compare([]) is None


def test_compare_kv_host_line():
    line = fp.compare([base(kv_host=True), base()])
    assert line == ("REFUSE rank settings: rank 1's kv_host differs from rank 0's "
                    "(--kv-host or CUPYGLM_KV_HOST or --kv-host-shared or CUPYGLM_KV_HOST_SHARED)")
    assert fp.compare([base(kv_host=True), base(kv_host=True, kv_host_shared=True)]) == line


@pytest.mark.parametrize("field, kw, how", [
    ("context", {"context": 8}, "--context"),
    ("parallel", {"parallel": 2}, "--parallel"),
    ("page_tokens", {"page_tokens": 16}, "--page-tokens"),
    ("kv_cache", {"kv_cache": "fp8"}, "--kv-cache"),
    ("kv_pages", {"kv_pages": 3}, "--kv-pages"),
    ("kv_gib", {"kv_gib": 1.0}, "--kv-gib"),
    ("prompt_cache_gib", {"prompt_cache_gib": 1.0}, "--prompt-cache-gib"),
    ("host_cache", {"host_cache": True}, "--host-cache or CUPYGLM_HOST_CACHE"),
    ("kv_share", {"kv_share": 16}, "--kv-share or CUPYGLM_KV_SHARE"),
    ("mtp_drafts", {"mtp_drafts": 1}, "--mtp-drafts"),
    ("memory_reserve_gib", {"memory_reserve_gib": 2.0}, "--memory-reserve-gib or CUPYGLM_MEMORY_RESERVE_GIB"),
    ("max_queue", {"max_queue": 1}, "--max-queue"),
    ("seed", {"seed": 1}, "--seed"),
    ("vision_host", {"vision_host": True}, "--vision-host or CUPYGLM_VISION_HOST"),
])
def test_compare_names_the_setting_and_how_it_is_set(field, kw, how):
    assert fp.compare([base(), base(), base(**kw)]) == \
        f"REFUSE rank settings: rank 2's {field} differs from rank 0's ({how})"


def test_compare_host_gib_and_model_and_backend():
    a = base(kv_host=True, kv_host_gib=2.0)
    b = base(kv_host=True, kv_host_gib=3.0)
    assert fp.compare([a, b]).endswith("rank 1's kv_host_gib differs from rank 0's (--kv-host-gib or CUPYGLM_KV_HOST_GIB)")
    m = dict(base(), model="ffff")
    assert fp.compare([base(), m]) == "REFUSE rank settings: rank 1's model differs from rank 0's (--model)"
    c = fp.fingerprint(Settings(), backend="cuda")
    assert fp.compare([base(), c]).endswith("rank 1's backend differs from rank 0's (--backend or CUPYGLM_BACKEND)")


def test_compare_reports_the_lowest_rank_and_first_field():
    assert fp.compare([base(), base(), base(context=1, seed=2), base(seed=3)]) == \
        "REFUSE rank settings: rank 2's context differs from rank 0's (--context)"


def test_compare_version_and_missing_keys():
    other = dict(base(), version=6)
    assert fp.compare([base(), other]) == ("REFUSE rank settings: rank 1's fingerprint version 6 differs from "
                                           "rank 0's 5 (the ranks run different cupyglm builds)")
    fewer = base()
    del fewer["seed"]
    assert fp.compare([base(), fewer]).startswith("REFUSE rank settings: rank 1's seed differs")
    more = dict(base(), extra=1)
    assert fp.compare([base(), more]) == "REFUSE rank settings: rank 1's extra differs from rank 0's (extra)"


def test_decide_invalid_value_wins_and_lowest_rank_reports():
    good = fp.payload_ok(base())
    bad1 = fp.payload_error("CUPYGLM_KV_HOST must be 0 or 1, got '2'")
    bad2 = fp.payload_error("CUPYGLM_KV_SHARE must be 0 or 1, got 'x'")
    assert fp.decide([good, good]) is None
    assert fp.decide([good, bad1, bad2]) == "REFUSE rank settings: CUPYGLM_KV_HOST must be 0 or 1, got '2'"
    assert fp.decide([fp.payload_ok(base(context=5)), bad2]) == \
        "REFUSE rank settings: CUPYGLM_KV_SHARE must be 0 or 1, got 'x'"
    assert fp.decide([good, fp.payload_ok(base(context=5))]) == \
        "REFUSE rank settings: rank 1's context differs from rank 0's (--context)"
    assert "rank 1 sent an unreadable fingerprint" in fp.decide([good, "garbage"])


def test_fingerprint_hash_is_canonical():
    a = base()
    b = dict(reversed(list(a.items())))
    assert fp.fingerprint_hash(a) == fp.fingerprint_hash(b)
    assert fp.fingerprint_hash(a) != fp.fingerprint_hash(base(seed=1))


def test_model_identity_hashes_the_quant_config(tmp_path):
    (tmp_path / "config.json").write_bytes(b'{"a": 1}')
    plain = fp.model_identity(tmp_path)
    (tmp_path / "hf_quant_config.json").write_bytes(b'{"quantization": {"quant_algo": "NVFP4", "group_size": 16}}')
    nvfp4 = fp.model_identity(tmp_path)
    assert nvfp4 != plain and nvfp4 == fp.model_identity(tmp_path)
    (tmp_path / "hf_quant_config.json").write_bytes(b'{"quantization": {"quant_algo": "NVFP4", "group_size": 32}}')
    assert fp.model_identity(tmp_path) not in (plain, nvfp4)


def test_ranks_of_another_arithmetic_are_refused_by_name():
    other = fp.fingerprint(Settings(), backend="numpy", arithmetic="arithmetic 1, tensor core sm_120")
    assert fp.compare([base(), base(), other]) == (
        "REFUSE rank settings: rank 2's arithmetic differs from rank 0's "
        "(the cupyglm build's ARITHMETIC version and the GPU's tensor core)")
    newer = fp.fingerprint(Settings(), backend="numpy", arithmetic="arithmetic 4, tensor core sm_90")
    assert "rank 1's arithmetic differs" in fp.decide([fp.payload_ok(base()), fp.payload_ok(newer)])
