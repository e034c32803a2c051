import pytest
import torch

from trace_gym.errors import ConfigError
from trace_gym.training.config import OPTIMIZERS, OptimConfig
from trace_gym.training.update.optimizers import make_optimizer


def test_make_optimizer_builds_every_named_optimizer():
    for name in OPTIMIZERS:
        p = torch.nn.Parameter(torch.ones(2))
        opt = make_optimizer([p], name, lr=0.1, momentum=0.5)
        p.grad = torch.ones(2)
        opt.step()
        assert torch.all(p.detach() < 1.0)


def test_unknown_optimizer_is_a_config_error():
    with pytest.raises(ConfigError, match="fix"):
        OptimConfig(optimizer="lion")
    with pytest.raises(ConfigError, match="fix"):
        make_optimizer([torch.nn.Parameter(torch.ones(1))], "lion", lr=0.1)
