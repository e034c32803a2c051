"""The data-parallel update (2 gloo processes: DDP, FSDP2, LoRA under FSDP2; and 2 Ray actors) equals the
single-process update on the same rows, with rows or packs (packing.py) on the ranks; merged LoRA weights
reproduce the adapter; gradient checkpointing does not change the step."""

from __future__ import annotations

import copy
import functools
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from trace_gym.training.update.batches import (  # noqa: E402
    UpdateBatch,
    token_logprobs,
    update_batch,
)
from trace_gym.training.update.models import LoraSettings, full_state_dict, prepare_model  # noqa: E402
from trace_gym.training.update.optimizer_step import policy_update  # noqa: E402
from trace_gym.training.update.packing import (  # noqa: E402
    pack_batches,
    shard_packs,
    trie_order,
)
from trace_gym.training.update.parallel import broadcast_object, host_store, ray_run, spawn  # noqa: E402
from trace_gym.training.update.samples import Sample  # noqa: E402

LORA = LoraSettings(r=4, alpha=8)
SCENARIOS = {"ddp": ("ddp", None), "fsdp": ("fsdp", None), "lora_fsdp": ("fsdp", LORA)}
ROWS, MICRO = 5, 2  # ranks get 3 and 2 rows: 2 micro-batches each, the second rank's last one is padding
PACKED = {"packed_ddp": ("ddp", None, 9), "packed_fsdp": ("fsdp", None, 9), "packed_lora_fsdp": ("fsdp", LORA, 9),
          "packed_idle": ("ddp", None, 1)}  # name -> strategy, LoRA, rows (1 row: the second rank has no pack)


def tiny_model(seed: int = 0):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=16, intermediate_size=128, vocab_size=300)
    return Qwen3ForCausalLM(config)


def make_batch(seed: int = 0) -> UpdateBatch:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 300, (ROWS, 12), generator=g)
    attention = torch.ones_like(ids)
    attention[1, 9:] = 0  # right padding
    attention[3, :2] = 0  # left padding
    loss_mask = (torch.rand(ids.shape, generator=g) < 0.6).long() * attention
    loss_mask[:, 0] = 0
    with torch.no_grad():
        old = token_logprobs(tiny_model(), ids, attention) + 0.1 * torch.randn(ids.shape, generator=g)
    advantages = torch.randn(ROWS, generator=g)
    return UpdateBatch(ids, attention, loss_mask, old, advantages)


def make_samples(n: int, seed: int = 0) -> list[Sample]:
    """``n`` rows of a small forest: two prompts, two turns, siblings that share their parent's context."""
    g = torch.Generator().manual_seed(seed)

    def ids(k: int) -> list[int]:
        return torch.randint(0, 300, (k,), generator=g).tolist()

    out = []
    for i in range(n):
        prompt = [7, 8, 9, *([11] * (i % 2))]
        turn1 = ids(3) if i % 3 else [5, 6, 7]  # some first actions repeat
        context = prompt if i % 4 < 2 else prompt + turn1 + ids(2)
        action = ids(2 + i % 3)
        # behaviour log-probs near the random model's -log(300), so that some ratios are clipped and some not
        out.append(Sample(context, action, (-5.7 + 0.3 * torch.randn(len(action), generator=g)).tolist(),
                          float(torch.randn(1, generator=g))))
    return [out[i] for i in trie_order([s.context + s.action for s in out], torch.Generator().manual_seed(seed))]


def train_once(model, batch, strategy: str = "single", lora: LoraSettings | None = None,
               checkpointing: bool = False):
    torch.manual_seed(1)  # LoRA's A init
    model = prepare_model(model, strategy, lora=lora, gradient_checkpointing=checkpointing)
    # SGD: the weight change is the (clipped) gradient itself; Adam's first step g/|g| would turn last-bit
    # differences of near-zero gradients into full-size steps.
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.0)
    stats = policy_update(model, optimizer, batch, micro_batch=MICRO, clip_low=0.2, clip_high=0.28, grad_clip=1.0)
    return model, stats


def _ranks(rank: int, world_size: int, out: str) -> None:
    results = {}
    batch = broadcast_object(make_batch() if rank == 0 else None)  # rank 0 collected the rows
    for name, (strategy, lora) in SCENARIOS.items():
        model, stats = train_once(tiny_model(), batch.shard(rank, world_size), strategy, lora)
        results[name] = (full_state_dict(model), stats)
    for name, (strategy, lora, n) in PACKED.items():
        packs = pack_batches(make_samples(n), max_tokens=12, parts=world_size)
        model, stats = train_once(tiny_model(), shard_packs(packs, rank, world_size), strategy, lora)
        results[name] = (full_state_dict(model), stats)
    if rank == 0:
        torch.save(results, out)


@pytest.fixture(scope="module")
def distributed(tmp_path_factory) -> dict:
    out = Path(tmp_path_factory.mktemp("dist")) / "results.pt"
    spawn(_ranks, 2, str(out), backend="gloo")
    return torch.load(out)


@functools.cache
def _single(lora: LoraSettings | None = None, checkpointing: bool = False, samples: int = 0):
    """One process; with ``samples``, the rows of `make_samples`."""
    batch = update_batch(make_samples(samples), pad_id=0) if samples else make_batch()
    model, stats = train_once(tiny_model(), batch, lora=lora, checkpointing=checkpointing)
    return model, full_state_dict(model), stats


def _assert_same_update(got: dict, want: dict) -> None:
    initial = tiny_model().state_dict()
    assert got.keys() == want.keys()
    moved = max(float((want[k] - initial[k]).abs().max()) for k in want)
    assert moved > 1e-2  # the step did something, so equality below is not vacuous
    for key in want:
        torch.testing.assert_close(got[key], want[key], atol=1e-6, rtol=1e-4, msg=key)


@pytest.mark.parametrize("scenario", ["ddp", "fsdp"])
def test_data_parallel_update_equals_single_process(distributed, scenario):
    state, _ = distributed[scenario]
    _assert_same_update(state, _single()[1])


def test_data_parallel_stats_equal_single_process(distributed):
    _, stats = distributed["fsdp"]
    _, _, want = _single()
    for key in ("loss/total", "loss/tokens", "loss/clip_frac", "loss/ratio_mean", "loss/grad_norm"):
        assert stats[key] == pytest.approx(want[key], rel=1e-4, abs=1e-6), key


def test_lora_under_fsdp_equals_single_process_lora(distributed):
    state, _ = distributed["lora_fsdp"]
    _assert_same_update(state, _single(lora=LORA)[1])


@pytest.mark.parametrize("scenario", list(PACKED))
def test_data_parallel_packed_update_equals_single_process_rows(distributed, scenario):
    _, lora, n = PACKED[scenario]
    state, stats = distributed[scenario]
    _, want, want_stats = _single(lora=lora, samples=n)
    _assert_same_update(state, want)
    for key in ("loss/total", "loss/tokens", "loss/clip_frac", "loss/ratio_mean", "loss/grad_norm"):
        assert stats[key] == pytest.approx(want_stats[key], rel=1e-4, abs=1e-6), key


def test_merged_lora_weights_reproduce_the_adapter():
    peft_model, merged, _ = _single(lora=LORA)
    plain = tiny_model()
    assert set(merged) == set(plain.state_dict())
    plain.load_state_dict(merged)
    batch = make_batch()
    with torch.no_grad():
        want = token_logprobs(peft_model.eval(), batch.input_ids, batch.attention_mask)
        got = token_logprobs(plain.eval(), batch.input_ids, batch.attention_mask)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert not torch.equal(merged["model.layers.0.self_attn.q_proj.weight"],
                           tiny_model().state_dict()["model.layers.0.self_attn.q_proj.weight"])


def test_gradient_checkpointing_gives_the_same_update():
    _, want, _ = _single()
    _, got, _ = _single(checkpointing=True)
    _assert_same_update(got, want)


def test_micro_batching_gives_the_same_update_as_one_pass():
    model = tiny_model()
    batch = make_batch()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    torch.manual_seed(1)
    policy_update(model, optimizer, batch, micro_batch=ROWS, clip_low=0.2, clip_high=0.28, grad_clip=1.0)
    _assert_same_update(copy.deepcopy(model.state_dict()), _single()[1])


def _ddp_rank(rank: int, world_size: int) -> dict | None:
    model, _ = train_once(tiny_model(), make_batch().shard(rank, world_size), "ddp")
    return full_state_dict(model)


def test_update_launched_by_ray_equals_single_process(ray_cluster):
    import sys

    ray_cluster.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # actors cannot import tests
    first, second = ray_run(_ddp_rank, 2)
    assert second is None
    _assert_same_update(first, _single()[1])


def test_the_rendezvous_port_stays_held_until_the_ranks_join() -> None:
    """spawn and ray_run host the store themselves: no gap between choosing the port and binding it."""
    import socket

    store = host_store("127.0.0.1", 1)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s, pytest.raises(OSError):
        s.bind(("127.0.0.1", store.port))
    store.set("k", "v")
    assert store.get("k") == b"v"
