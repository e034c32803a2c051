"""Process groups for the data-parallel update: joining torchrun's, starting one on one machine (`spawn`) or on
the nodes of a Ray cluster (`ray_run`), and moving Python objects between ranks. The same code runs on CPU (gloo;
the tests use 2 processes) and on GPUs (NCCL).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from trace_gym.errors import ConfigError


def world() -> tuple[int, int]:
    """(rank, world size); (0, 1) without a process group."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def init_from_env(backend: str | None = None) -> tuple[int, int]:
    """Join the process group described by torchrun's variables (RANK, WORLD_SIZE, MASTER_ADDR, ...).

    NCCL when CUDA is available (each process takes GPU ``LOCAL_RANK``), gloo otherwise.
    """
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        raise ConfigError("expected torchrun's RANK and WORLD_SIZE in the environment, got neither; "
                          "fix: launch with `torchrun --nproc-per-node N ...` or use spawn()")
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        dist.init_process_group(backend)
    return world()


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """``obj`` from rank ``src`` on every rank (e.g. the step's `UpdateBatch`, built by the rank that collected
    the trees); returns ``obj`` unchanged without a process group."""
    if not (dist.is_available() and dist.is_initialized()):
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def host_store(host: str, world_size: int) -> dist.TCPStore:
    """A rendezvous store listening on a port the OS picks, for ranks that join with ``TORCHELASTIC_USE_AGENT_STORE``
    (as under torchrun). Held by the caller for the whole run, so no other process can take the port between
    choosing it and binding it, the race of picking a free port and letting rank 0 bind it later."""
    return dist.TCPStore(host, 0, world_size, is_master=True, wait_for_workers=False)


def _join_hosted(addr: str, port: int, rank: int, world_size: int, local_rank: int) -> None:
    os.environ.update(MASTER_ADDR=addr, MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_RANK=str(local_rank), TORCHELASTIC_USE_AGENT_STORE="True")


def _spawned(rank: int, world_size: int, port: int, backend: str, fn: Callable[..., Any], args: tuple) -> None:
    _join_hosted("127.0.0.1", port, rank, world_size, rank)
    torch.set_num_threads(1)  # one process per core; oversubscribed threads are slower, not faster
    init_from_env(backend)
    try:
        fn(rank, world_size, *args)
        dist.barrier()  # leave together: a rank tearing down while its peer still talks aborts the peer (gloo)
    finally:
        dist.destroy_process_group()


def spawn(fn: Callable[..., Any], world_size: int, *args: Any, backend: str | None = None) -> None:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` fresh processes joined in one process group
    (one machine; ``fn`` must be importable, i.e. a module-level function)."""
    import torch.multiprocessing as mp

    if world_size < 1:
        raise ConfigError(f"expected world_size >= 1, got {world_size}")
    backend = backend or ("nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= world_size
                          else "gloo")
    store = host_store("127.0.0.1", world_size)  # listens until spawn returns
    mp.spawn(_spawned, args=(world_size, store.port, backend, fn, args), nprocs=world_size, join=True)


class _Rank:
    """A Ray actor that joins a process group as one rank (see `ray_run`)."""

    def host(self, world_size: int) -> tuple[str, int]:
        """Host the group's rendezvous store (rank 0's actor, for as long as it lives); its address."""
        import ray

        addr = ray.util.get_node_ip_address()
        self._store = host_store(addr, world_size)
        return addr, self._store.port

    def run(self, rank: int, world_size: int, master: tuple[str, int], backend: str, fn: Callable[..., Any],
            args: tuple) -> Any:
        # Ray gives each actor its own CUDA_VISIBLE_DEVICES, so the actor's GPU is always device 0.
        _join_hosted(master[0], master[1], rank, world_size, 0)
        init_from_env(backend)
        try:
            out = fn(rank, world_size, *args)
            dist.barrier()  # leave together, as in spawn
            return out
        finally:
            dist.destroy_process_group()


def ray_run(fn: Callable[..., Any], world_size: int, *args: Any, num_gpus_per_rank: float = 0.0,
            num_cpus_per_rank: float = 1.0, backend: str | None = None) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` Ray actors joined in one process group (any nodes of
    the connected cluster; rank 0's node hosts the rendezvous); returns the ranks' results in rank order."""
    import ray

    if world_size < 1:
        raise ConfigError(f"expected world_size >= 1, got {world_size}")
    backend = backend or ("nccl" if num_gpus_per_rank > 0 else "gloo")
    actor = ray.remote(num_cpus=num_cpus_per_rank, num_gpus=num_gpus_per_rank)(_Rank)
    ranks: list[Any] = [actor.remote() for _ in range(world_size)]  # Ray types only @ray.method methods
    try:
        master = ray.get(ranks[0].host.remote(world_size))
        return ray.get([r.run.remote(i, world_size, master, backend, fn, args) for i, r in enumerate(ranks)])
    finally:
        for r in ranks:
            ray.kill(r)



def join_process_group(strategy: str) -> tuple[int, int]:
    """(rank, world size): joins torchrun's process group for ``ddp``/``fsdp`` unless already in one."""
    if strategy == "single":
        return 0, 1
    if not torch.distributed.is_initialized():
        init_from_env()
    return world()
