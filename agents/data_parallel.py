"""Data parallelism over processes on one machine: each process runs its share of a batch on one thread, and the
gradients are summed through shared memory once a step.

Why processes and not torch's threads for a small model: the scheduler shares the cores among threads, and torch
splits every operator of a small model over its threads, which then wait for each other at its end. Beside other
work a thread that lost its core stalls its partner at every operator; a process that lost its core stalls the
others once, at the step's end. Measured on 2 cores with the tiny model's SFT (docs/measured.md). This is for
one machine and a caller that starts it itself; the RL update's data parallelism across GPUs and hosts is
torch.distributed (`model.strategy: ddp`, started by torchrun or Ray).

Rank 0 is the calling process (its callbacks, progress and result stay where the caller is); ranks 1.. are
fresh Python processes (``python -m trace_gym.agents.data_parallel``: nothing of the caller's script runs again,
and torch starts with one thread). Every rank starts from rank 0's trainable weights, samples the same batch,
trains on its own rows of it and applies the same summed gradient, so the copies stay equal (checked at the end).
One difference from one process: a parameter that gets no gradient in a step gets a zero one, which AdamW still
steps (its momentum and weight decay); a causal LM's trained parameters all get one at every step.

The barrier is a pair of pipes per spawned rank: it writes a byte and reads one, rank 0 reads one from each and
then writes one to each. A rank that dies closes its pipe, and rank 0's read ends at once with `RankFailed`; a
rank whose parent died reads the end of its pipe and exits. The shared memory is a file in /dev/shm, removed once
every rank has mapped it (after the first step), so no failure leaves it behind (the temporary directory where
/dev/shm has no room).
"""

from __future__ import annotations

import importlib
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

STOP_GRACE_S = 10.0  # how long spawned ranks get to leave after rank 0 stops, before they are killed


class RankFailed(RuntimeError):
    """A rank of the team stopped before the end (a spawned rank's traceback is on stderr)."""


class Barrier(Protocol):
    def wait(self) -> None: ...


@dataclass
class Shared:
    """What the ranks share, views of one memory-mapped file: gradient rows and loss parts (two of each, by step
    parity, so one barrier a step suffices), the trainable weights at the start (rank 0's) and at the end (each
    rank's); and the barrier."""

    grads: torch.Tensor  # (2, world, numel)
    losses: torch.Tensor  # (2, world)
    weights: torch.Tensor  # (world, numel)
    barrier: Barrier

    @property
    def world(self) -> int:
        return self.grads.shape[1]

    @staticmethod
    def floats(world: int, numel: int) -> list[int]:
        """The sizes of the parts, in float32s."""
        return [2 * world * numel, 2 * world, world * numel]

    @classmethod
    def create(cls, path: str, world: int, numel: int, barrier: Barrier) -> Shared:
        """Rank 0: a file of zeros at ``path`` with every page allocated now (a full tmpfs is an OSError here, not a
        SIGBUS at a later write), and its views."""
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            size = 4 * sum(cls.floats(world, numel))
            if hasattr(os, "posix_fallocate"):
                os.posix_fallocate(fd, 0, size)
            else:  # no such call (macOS): a sparse file
                os.ftruncate(fd, size)
        finally:
            os.close(fd)
        return cls.attach(path, world, numel, barrier)

    @classmethod
    def attach(cls, path: str, world: int, numel: int, barrier: Barrier) -> Shared:
        """The views of the file at ``path``, created by rank 0."""
        sizes = cls.floats(world, numel)
        data = torch.from_file(path, shared=True, size=sum(sizes), dtype=torch.float32)
        grads, losses, weights = torch.split(data, sizes)
        return cls(grads.view(2, world, numel), losses.view(2, world), weights.view(world, numel), barrier)


def flat(tensors: Sequence[torch.Tensor | None], like: Sequence[torch.Tensor]) -> torch.Tensor:
    """The tensors (a missing gradient as zeros shaped like its parameter) as one flat float32 vector."""
    return torch.cat([(t if t is not None else torch.zeros_like(p)).detach().reshape(-1).float()
                      for t, p in zip(tensors, like)])


def unflatten_into(vector: torch.Tensor, params: Sequence[torch.Tensor], grads: bool) -> None:
    """Copy ``vector`` into the parameters' gradients (``grads``) or values, in order."""
    offset = 0
    for p in params:
        part = vector[offset:offset + p.numel()].view_as(p).to(p.dtype)
        offset += p.numel()
        if grads:
            p.grad = part.clone()
        else:
            with torch.no_grad():
                p.copy_(part)


def sum_gradients(shared: Shared, rank: int, step: int, params: Sequence[torch.Tensor], loss: float) -> float:
    """Put this rank's gradients and loss part for ``step``, wait for every rank, and set each parameter's gradient
    to the sum over ranks (added in rank order on every rank, so all get the same bits); returns the summed loss."""
    parity = step % 2
    shared.grads[parity, rank].copy_(flat([p.grad for p in params], params))
    shared.losses[parity, rank] = loss
    shared.barrier.wait()
    total = shared.grads[parity, 0].clone()
    for r in range(1, shared.world):
        total += shared.grads[parity, r]
    unflatten_into(total, params, grads=True)
    return float(shared.losses[parity].sum())


def begin(shared: Shared, params: Sequence[torch.Tensor]) -> None:
    """A spawned rank's start: take rank 0's trainable weights (a LoRA adapter's random start included)."""
    unflatten_into(shared.weights[0], params, grads=False)


def end(shared: Shared, rank: int, params: Sequence[torch.Tensor]) -> None:
    """A rank's end: write its final weights for rank 0's check and wait for the others'."""
    shared.weights[rank].copy_(flat(params, params))
    shared.barrier.wait()


class _Spoke:
    """A spawned rank's side of the barrier."""

    def __init__(self, to_hub: int, from_hub: int) -> None:
        self.to_hub, self.from_hub = to_hub, from_hub

    def wait(self) -> None:
        try:
            os.write(self.to_hub, b".")
            if os.read(self.from_hub, 1) != b".":
                raise RankFailed("rank 0 stopped")
        except BrokenPipeError:
            raise RankFailed("rank 0 stopped") from None


class _Hub:
    """Rank 0's side: a byte from every spawned rank, then one to each."""

    def __init__(self, team: Team) -> None:
        self.team = team

    def wait(self) -> None:
        for rank, (proc, from_rank, _) in enumerate(self.team.ranks, start=1):
            if os.read(from_rank, 1) != b".":
                raise self.team.failure(rank, proc)
        for rank, (proc, _, to_rank) in enumerate(self.team.ranks, start=1):
            try:
                os.write(to_rank, b".")
            except BrokenPipeError:
                raise self.team.failure(rank, proc) from None
        if not self.team.unlinked:  # every rank has mapped the memory by its first wait
            self.team.unlink()


class Team:
    """``world`` processes training copies of one model in step; the caller is rank 0. Use as a context manager:
    leaving it stops and reaps the spawned ranks, whatever happened."""

    def __init__(self, world: int, params: Sequence[torch.Tensor]) -> None:
        self.numel = numel = sum(p.numel() for p in params)
        self.dir = Path(tempfile.mkdtemp(prefix="trace-gym-dp-", dir=_memory_dir(4 * sum(Shared.floats(world, numel)))))
        self.path = str(self.dir / "shared")
        self.unlinked = False
        self.ranks: list[tuple[subprocess.Popen[bytes], int, int]] = []  # process, read end, write end
        try:
            self.shared = Shared.create(self.path, world, numel, _Hub(self))
            self.shared.weights[0].copy_(flat(params, params))
        except BaseException:
            self.unlink()
            raise

    def start(self, target: Callable[..., None], *args: Any) -> None:
        """Spawn ranks 1.. running ``target(rank, shared, *args)``: a module-level function, and arguments pickled
        once to a file every rank reads. Each rank imports what this process imports (its ``sys.path``), runs in
        its own process group (a terminal's Ctrl-C reaches rank 0, which ends the rest through the pipes) and
        uses one thread."""
        if "<" in target.__qualname__:
            raise TypeError(f"expected a module-level function, got {target.__qualname__}")
        with open(self.dir / "args.pickle", "wb") as f:
            pickle.dump({"target": (target.__module__, target.__qualname__), "args": args, "path": self.path,
                         "world": self.shared.world, "numel": self.numel}, f)
        path = [os.path.abspath(p) for p in sys.path]  # "" (the current folder) made absolute
        env = {**os.environ, "OMP_NUM_THREADS": "1", "TRACE_GYM_THREADS": "1", "PYTHONPATH": os.pathsep.join(path)}
        for rank in range(1, self.shared.world):
            to_hub_r, to_hub_w = os.pipe()
            from_hub_r, from_hub_w = os.pipe()
            try:
                proc = subprocess.Popen([sys.executable, "-P", "-m", __name__, str(self.dir / "args.pickle"),
                                         str(rank), str(to_hub_w), str(from_hub_r)],
                                        env=env, stdin=subprocess.DEVNULL, pass_fds=(to_hub_w, from_hub_r),
                                        process_group=0)
            except BaseException:
                for fd in (to_hub_r, to_hub_w, from_hub_r, from_hub_w):
                    os.close(fd)
                raise
            os.close(to_hub_w)
            os.close(from_hub_r)
            self.ranks.append((proc, to_hub_r, from_hub_w))

    def finish(self, params: Sequence[torch.Tensor]) -> None:
        """Rank 0's end: wait for every rank's final weights and check that they equal its own."""
        end(self.shared, 0, params)
        for rank in range(1, self.shared.world):
            if not torch.equal(self.shared.weights[rank], self.shared.weights[0]):
                raise RuntimeError(f"data-parallel rank {rank} ended with weights that differ from rank 0's")

    @staticmethod
    def failure(rank: int, proc: subprocess.Popen[bytes]) -> RankFailed:
        """The error for a spawned rank that closed its pipe (given a moment to exit, for its code)."""
        try:
            code: int | None = proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            code = None
        said = f"exited with code {code}" if code is not None else "closed its pipe"
        return RankFailed(f"data-parallel rank {rank} {said} before the end (its traceback, if any, is above)")

    def __enter__(self) -> Team:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            for _, from_rank, to_rank in self.ranks:  # a rank waiting at the barrier reads the end of its pipe
                os.close(from_rank)
                os.close(to_rank)
            deadline = time.monotonic() + STOP_GRACE_S
            for proc, _, _ in self.ranks:
                try:
                    proc.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        finally:
            self.unlink()

    def unlink(self) -> None:
        """Remove the shared file and the ranks' argument files: mapped memory outlives its name, so once every
        rank has mapped it nothing is left to clean up, whoever dies."""
        shutil.rmtree(self.dir, ignore_errors=True)
        self.unlinked = True


def _memory_dir(size: int) -> str | None:
    """/dev/shm where it has room for ``size`` bytes twice over (a full tmpfs kills a writer with SIGBUS; a
    container's is often 64 MB), else the temporary directory (None)."""
    try:
        stat = os.statvfs("/dev/shm")
    except OSError:
        return None
    return "/dev/shm" if stat.f_bavail * stat.f_frsize >= 2 * size else None


def _rank_main(args_path: str, rank: int, to_hub: int, from_hub: int) -> None:
    torch.set_num_threads(1)
    with open(args_path, "rb") as f:
        spec = pickle.load(f)
    module, name = spec["target"]
    target = getattr(importlib.import_module(module), name)
    shared = Shared.attach(spec["path"], spec["world"], spec["numel"], _Spoke(to_hub, from_hub))
    try:
        target(rank, shared, *spec["args"])
    except RankFailed:  # rank 0 stopped (its own error, or an early stop): nothing of ours to report
        shutil.rmtree(Path(spec["path"]).parent, ignore_errors=True)  # if it died before anyone removed it
        sys.exit(0)


if __name__ == "__main__":
    _rank_main(sys.argv[1], *map(int, sys.argv[2:5]))
