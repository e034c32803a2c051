"""The study optimiser NormalizedSGD: a step of length lr along the gradient, whatever its scale."""

import pytest
import torch

from benchmarks.studies.normalized_sgd import NormalizedSGD


def test_normalized_sgd_steps_lr_along_the_gradient():
    a, b = torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(2))
    opt = NormalizedSGD([a, b], lr=0.1)
    a.grad, b.grad = torch.tensor([3.0, 0.0, 0.0]), torch.tensor([0.0, 4.0])
    opt.step()
    step = torch.cat([a.detach(), b.detach()])
    assert torch.linalg.vector_norm(step).item() == pytest.approx(0.1)
    assert torch.allclose(step, -0.1 * torch.tensor([3.0, 0, 0, 0, 4.0]) / 5.0)


def test_normalized_sgd_step_length_does_not_depend_on_gradient_scale():
    lengths = []
    for scale in (1e-6, 1.0, 1e4):
        p = torch.nn.Parameter(torch.zeros(4))
        p.grad = scale * torch.tensor([1.0, -2.0, 0.5, 0.0])
        NormalizedSGD([p], lr=0.02).step()
        lengths.append(torch.linalg.vector_norm(p.detach()).item())
    assert lengths == pytest.approx([0.02] * 3)
