"""Settings from flags and the environment: defaults, every invalid value named, unavailable features refused."""
from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

from cupyglm import env
from cupyglm.settings import MEMORY_FLAGS, SOURCES, UNAVAILABLE, Settings, SettingsError, add_arguments


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in env.VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def settings(*argv: str, **environ: str) -> Settings:
    with pytest.MonkeyPatch.context() as mp:
        for k, v in environ.items():
            mp.setenv(k, v)
        return Settings.from_argv(list(argv))


def refused(*argv: str, **environ: str) -> str:
    with pytest.raises(SettingsError) as info:
        settings(*argv, **environ)
    return str(info.value)


def test_defaults():
    s = settings()
    assert s == Settings()
    assert (s.model, s.backend, s.context, s.parallel, s.page_tokens, s.kv_cache, s.kv_pages, s.kv_gib) == \
        (None, "auto", 0, 4, 0, "bf16", 0, None)
    assert (s.prompt_cache_gib, s.host_cache, s.kv_share, s.kv_host, s.kv_host_shared, s.kv_host_gib) == \
        (0.0, False, 0, False, False, None)
    assert (s.mtp_drafts, s.memory_reserve_gib, s.max_queue, s.seed, s.model_id) == (0, 1.0, 256, 0, None)
    assert s.kv_host_mode == 0


def test_flags_and_env_parse():
    s = settings("--model", "/m", "--backend", "sim", "--context", "4096", "--parallel", "2", "--page-tokens", "16",
                 "--kv-cache", "fp8", "--kv-pages", "9", "--kv-gib", "1.5", "--prompt-cache-gib", "0.25",
                 "--mtp-drafts", "15", "--max-queue", "0", "--seed", "18446744073709551615",
                 CUPYGLM_HOST_CACHE="1", CUPYGLM_KV_SHARE="16", CUPYGLM_KV_HOST="1", CUPYGLM_KV_HOST_SHARED="1",
                 CUPYGLM_KV_HOST_GIB="2.5", CUPYGLM_MEMORY_RESERVE_GIB="0")
    assert s == Settings(model="/m", backend="sim", context=4096, parallel=2, page_tokens=16, kv_cache="fp8",
                         kv_pages=9, kv_gib=1.5, prompt_cache_gib=0.25, host_cache=True, kv_share=16, kv_host=True,
                         kv_host_shared=True, kv_host_gib=2.5, mtp_drafts=15, memory_reserve_gib=0.0, max_queue=0,
                         seed=2**64 - 1)
    assert s.kv_host_mode == 2
    assert settings(CUPYGLM_KV_HOST="1").kv_host_mode == 1


def test_backend_flag_beats_env():
    assert settings(CUPYGLM_BACKEND="sim").backend == "sim"
    assert settings("--backend", "numpy", CUPYGLM_BACKEND="sim").backend == "numpy"


def test_empty_variable_counts_as_unset():
    assert settings(CUPYGLM_KV_HOST="", CUPYGLM_KV_HOST_GIB="").kv_host is False


@pytest.mark.parametrize("name", ["CUPYGLM_HOST_CACHE", "CUPYGLM_KV_HOST", "CUPYGLM_KV_HOST_SHARED"])
@pytest.mark.parametrize("value", ["yes", "2", "true", " 1", "01"])
def test_bool_variables_take_only_0_or_1(name, value):
    extra = {"CUPYGLM_KV_HOST": "1"} if name == "CUPYGLM_KV_HOST_SHARED" else {}
    assert refused(**extra, **{name: value}) == f"{name} must be 0 or 1, got {value!r}"


@pytest.mark.parametrize("value, message", [("yes", "an integer, got 'yes'"), ("-1", "an integer >= 0, got -1"),
                                            ("1.5", "an integer, got '1.5'")])
def test_kv_share_takes_a_count(value, message):
    assert refused(CUPYGLM_KV_SHARE=value) == f"CUPYGLM_KV_SHARE must be {message}"
    assert settings(CUPYGLM_KV_SHARE="0").kv_share == 0 and settings(CUPYGLM_KV_SHARE="").kv_share == 0


def test_kv_host_yes_message():
    assert refused(CUPYGLM_KV_HOST="yes") == "CUPYGLM_KV_HOST must be 0 or 1, got 'yes'"


def test_shared_needs_base():
    assert refused(CUPYGLM_KV_HOST_SHARED="1") == "CUPYGLM_KV_HOST_SHARED=1 needs CUPYGLM_KV_HOST=1"
    assert refused(CUPYGLM_KV_HOST="0", CUPYGLM_KV_HOST_SHARED="1") == \
        "CUPYGLM_KV_HOST_SHARED=1 needs CUPYGLM_KV_HOST=1"
    assert settings(CUPYGLM_KV_HOST_SHARED="0").kv_host_shared is False


@pytest.mark.parametrize("value", ["0", "-1", "abc", "nan", "inf"])
def test_kv_host_gib_positive(value):
    assert refused(CUPYGLM_KV_HOST="1", CUPYGLM_KV_HOST_GIB=value) == \
        f"CUPYGLM_KV_HOST_GIB must be a positive number, got {value!r}"


def test_kv_host_gib_needs_base():
    assert refused(CUPYGLM_KV_HOST_GIB="4") == "CUPYGLM_KV_HOST_GIB needs CUPYGLM_KV_HOST=1"


@pytest.mark.parametrize("value", ["-0.5", "x", "nan"])
def test_memory_reserve(value):
    assert refused(CUPYGLM_MEMORY_RESERVE_GIB=value) == \
        f"CUPYGLM_MEMORY_RESERVE_GIB must be a number >= 0, got {value!r}"


@pytest.mark.parametrize("argv, message", [
    (["--backend", "tpu"], "--backend must be one of auto, numpy, sim, cuda, got 'tpu'"),
    (["--context", "-1"], "--context must be an integer >= 0, got -1"),
    (["--context", "1k"], "--context must be an integer, got '1k'"),
    (["--parallel", "0"], "--parallel must be an integer >= 1, got 0"),
    (["--page-tokens", "6"], "--page-tokens must be 0 (the model's default) or a positive multiple of 4, got 6"),
    (["--page-tokens", "-4"], "--page-tokens must be an integer >= 0, got -4"),
    (["--kv-cache", "fp16"], "--kv-cache must be one of bf16, fp8, got 'fp16'"),
    (["--kv-pages", "-2"], "--kv-pages must be an integer >= 0, got -2"),
    (["--kv-gib", "0"], "--kv-gib must be a positive number, got '0'"),
    (["--prompt-cache-gib", "-1"], "--prompt-cache-gib must be a number >= 0, got '-1'"),
    (["--mtp-drafts", "16"], "--mtp-drafts must be an integer 0..15, got 16"),
    (["--max-queue", "-1"], "--max-queue must be an integer >= 0, got -1"),
    (["--seed", "-1"], "--seed must be an integer 0..18446744073709551615, got -1"),
    (["--model", ""], "--model must be a checkpoint directory, got ''"),
])
def test_invalid_flags_named(argv, message):
    assert refused(*argv) == message


def test_backend_env_named():
    assert refused(CUPYGLM_BACKEND="gpu") == "CUPYGLM_BACKEND must be one of auto, numpy, sim, cuda, got 'gpu'"


def test_direct_construction_is_checked():
    with pytest.raises(SettingsError, match="--context"):
        Settings(context=-1)
    with pytest.raises(SettingsError, match="CUPYGLM_KV_HOST_SHARED=1 needs"):
        Settings(kv_host_shared=True)
    with pytest.raises(SettingsError, match="CUPYGLM_KV_HOST_GIB needs"):
        Settings(kv_host_gib=1.0)
    s = dataclasses.replace(Settings(), model_id="abc")
    assert s.model_id == "abc"


def test_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        Settings().context = 5  # type: ignore[misc]


def test_from_args_tolerates_missing_flags():
    assert Settings.from_args(argparse.Namespace(context=8)) == Settings(context=8)


def test_add_arguments_does_not_validate_itself():
    p = argparse.ArgumentParser()
    add_arguments(p)
    ns = p.parse_args(["--context", "nope"])
    with pytest.raises(SettingsError, match="--context"):
        Settings.from_args(ns)


def test_every_field_says_how_it_is_set():
    fields = {f.name for f in dataclasses.fields(Settings)} - {"model_id"}
    assert fields <= set(SOURCES)
    assert Settings.how_set("kv_host") == "--kv-host or CUPYGLM_KV_HOST or --kv-host-shared or CUPYGLM_KV_HOST_SHARED"
    assert Settings.how_set("context") == "--context"
    for name, how in SOURCES.items():
        for part in how.split(" or "):
            assert part.startswith("--") or part in env.VARIABLES, (name, part)


def test_line():
    assert SettingsError("X must be 0 or 1, got '2'").line == "REFUSE rank settings: X must be 0 or 1, got '2'"
    assert SettingsError("REFUSE rank settings: already").line == "REFUSE rank settings: already"


@pytest.mark.parametrize("kwargs, message", [
    ({"kv_cache": "fp8"}, "--kv-cache fp8: fp8 KV is not available yet"),
    ({"kv_host": True, "kv_cache": "fp8"}, "CUPYGLM_KV_HOST=1 with --kv-cache fp8: host KV rows are bf16 latent "
                                           "rows on pages (use --kv-cache bf16)"),
    ({"kv_share": 16}, "CUPYGLM_KV_SHARE=16 needs a prompt cache (--prompt-cache-gib > 0): a kept prompt's fixed "
                       "parts and its last, partly filled page live there"),
    ({"kv_share": 2, "prompt_cache_gib": 1.0, "kv_host": True}, "CUPYGLM_KV_SHARE=2 with CUPYGLM_KV_HOST=1: kept "
                                                                "prompts share device KV pages, and with host KV rows "
                                                                "the latent rows are not on those pages"),
])
def test_refuse_unavailable(kwargs, message):
    with pytest.raises(SettingsError) as info:
        Settings(**kwargs).refuse_unavailable()
    assert str(info.value) == message
    assert info.value.agreed


def test_refuse_unavailable_names_each_part_of_kv_host():
    Settings(kv_host=True, kv_host_gib=3.0).refuse_unavailable()          # host KV rows are built
    Settings(kv_host=True, kv_host_shared=True, kv_host_gib=3.0).refuse_unavailable()   # and shared per host
    with pytest.raises(SettingsError, match="needs CUPYGLM_KV_HOST=1"):
        Settings(kv_host_shared=True)
    Settings(kv_host=True).refuse_unavailable(available=set(UNAVAILABLE))


def test_plain_settings_pass_refuse_unavailable():
    Settings().refuse_unavailable()
    Settings(prompt_cache_gib=0.0, mtp_drafts=0).refuse_unavailable()
    Settings(prompt_cache_gib=2.0, host_cache=True).refuse_unavailable()      # the prompt cache is built
    Settings(prompt_cache_gib=0.5, kv_share=16).refuse_unavailable()            # kept prompts as pool pages
    Settings(prompt_cache_gib=0.5, kv_share=16, host_cache=True).refuse_unavailable()


def test_kv_share_with_host_kv_rows_is_refused_once_host_rows_exist():
    s = Settings(prompt_cache_gib=1.0, kv_share=4, kv_host=True)
    with pytest.raises(SettingsError, match="CUPYGLM_KV_SHARE=4 with CUPYGLM_KV_HOST=1: kept prompts share device KV") \
            as info:
        s.refuse_unavailable(available={"kv_host"})
    assert info.value.agreed


def test_kv_share_with_a_disk_tier_is_refused(tmp_path):
    s = Settings(prompt_cache_gib=1.0, kv_share=4, prompt_cache_dir=str(tmp_path))
    with pytest.raises(SettingsError, match="CUPYGLM_KV_SHARE=4 with --prompt-cache-dir: a state file holds a whole") \
            as info:
        s.refuse_unavailable()
    assert info.value.agreed
    Settings(prompt_cache_gib=1.0, prompt_cache_dir=str(tmp_path)).refuse_unavailable()


def test_mtp_drafts_are_built():
    s = Settings.from_argv(["--mtp-drafts", "3"])
    assert s.mtp_drafts == 3
    s.refuse_unavailable()                       # MTP drafts are no longer refused
    with pytest.raises(SettingsError, match="--mtp-drafts"):
        Settings.from_argv(["--mtp-drafts", "16"])


def test_readme_environment_table_is_env_variables():
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert env.table_markdown() in readme


def test_product_code_reads_no_test_only_variable():
    # a test watches a rank through observers it wires in (tests/observed_serve.py), never through the environment
    root = Path(__file__).resolve().parents[2] / "cupyglm"
    assert not [n for n, (_, meaning) in env.VARIABLES.items() if "TEST" in n or "test" in meaning]
    assert not [p for p in root.rglob("*.py") if "CUPYGLM_TEST_" in p.read_text()]


def test_memory_plan_flags_and_their_aliases():
    flags = settings("--host-cache", "--kv-share", "3", "--kv-host", "--kv-host-shared", "--kv-host-gib", "2.5",
                     "--memory-reserve-gib", "0.5", "--cuda-graphs", "--vision-host")
    aliases = settings(CUPYGLM_HOST_CACHE="1", CUPYGLM_KV_SHARE="3", CUPYGLM_KV_HOST="1", CUPYGLM_KV_HOST_SHARED="1",
                       CUPYGLM_KV_HOST_GIB="2.5", CUPYGLM_MEMORY_RESERVE_GIB="0.5", CUPYGLM_VISION_HOST="1")
    assert dataclasses.replace(flags, cuda_graphs=None) == aliases
    assert flags.cuda_graphs is True and aliases.cuda_graphs is None        # None: the alias decides at build time
    assert set(MEMORY_FLAGS) == {"host_cache", "kv_share", "kv_host", "kv_host_shared", "kv_host_gib",
                                 "memory_reserve_gib", "vision_host", "cuda_graphs"}


def test_a_flag_wins_over_its_alias_and_errors_name_the_flag():
    s = settings("--no-kv-host", "--kv-share", "0", "--memory-reserve-gib", "2", CUPYGLM_KV_HOST="1",
                 CUPYGLM_KV_SHARE="4", CUPYGLM_MEMORY_RESERVE_GIB="0")
    assert (s.kv_host, s.kv_share, s.memory_reserve_gib) == (False, 0, 2.0)
    assert settings("--no-cuda-graphs", CUPYGLM_CUDA_GRAPHS="1").cuda_graphs is False
    assert refused("--kv-share", "x") == "--kv-share must be an integer, got 'x'"
    assert refused("--memory-reserve-gib", "-1") == "--memory-reserve-gib must be a number >= 0, got '-1'"
    assert refused("--kv-host-gib", "0") == "--kv-host-gib must be a positive number, got '0'"
    assert refused("--kv-host-shared") == "--kv-host-shared needs --kv-host"
    assert refused("--kv-host-gib", "1") == "--kv-host-gib needs --kv-host"
    assert settings("--kv-host-shared", CUPYGLM_KV_HOST="1").kv_host_mode == 2


def test_flags_and_aliases_give_the_same_fingerprint():
    from cupyglm.distributed import fingerprint as fp

    by_flag = settings("--kv-host", "--kv-host-gib", "2", "--memory-reserve-gib", "0", "--cuda-graphs")
    by_env = settings(CUPYGLM_KV_HOST="1", CUPYGLM_KV_HOST_GIB="2", CUPYGLM_MEMORY_RESERVE_GIB="0")
    assert fp.fingerprint(by_flag, backend="numpy") == fp.fingerprint(by_env, backend="numpy")


def test_vision_flags():
    import dataclasses as dc

    from cupyglm.config import preset
    from cupyglm.engine.build import vision_on

    s = Settings.from_argv(["--no-vision", "--vision-max-images", "2"])
    assert s.vision is False and s.vision_max_images == 2
    assert Settings.from_argv([]).vision is None and Settings.from_argv([]).vision_max_images == 4
    with pytest.raises(SettingsError, match="--vision-max-images"):
        Settings.from_argv(["--vision-max-images", "0"])
    tiny, text_only = preset("tiny"), dc.replace(preset("tiny"), vision=None)
    assert vision_on(Settings(), tiny) and not vision_on(Settings(vision=False), tiny)
    assert not vision_on(Settings(), text_only)
    with pytest.raises(SettingsError, match="--vision: the checkpoint has no vision tower"):
        vision_on(Settings(vision=True), text_only)


def test_vision_host_flag_and_alias():
    import dataclasses as dc

    from cupyglm.config import preset
    from cupyglm.distributed import fingerprint as fp
    from cupyglm.engine.build import vision_on

    assert settings().vision_host is False
    by_flag, by_env = settings("--vision-host"), settings(CUPYGLM_VISION_HOST="1")
    assert by_flag.vision_host and by_env.vision_host
    assert fp.fingerprint(by_flag, backend="numpy") == fp.fingerprint(by_env, backend="numpy")
    assert settings("--no-vision-host", CUPYGLM_VISION_HOST="1").vision_host is False       # the flag wins
    with pytest.raises(SettingsError, match="CUPYGLM_VISION_HOST must be 0 or 1"):
        settings(CUPYGLM_VISION_HOST="yes")
    text_only = dc.replace(preset("tiny"), vision=None)
    for s in (Settings(vision_host=True), Settings(vision_host=True, vision=False)):
        with pytest.raises(SettingsError, match="--vision-host or CUPYGLM_VISION_HOST=1: no vision tower"):
            vision_on(s, text_only if s.vision is None else preset("tiny"))
