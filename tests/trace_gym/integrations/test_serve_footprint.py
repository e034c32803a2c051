"""The env server's budget check with an env whose footprint is fractional (a `Footprint`'s fields are floats)."""

from __future__ import annotations

import pytest

from tests.training.parity_env import ParityEnv
from trace_gym.errors import ConfigError
from trace_gym.integrations.env_server import EnvServer, ServeLimits
from trace_gym.limits import Footprint, available_memory


class FractionalParityEnv(ParityEnv):
    """ParityEnv declaring a live unit's memory as a float: a little under a twentieth of the available memory."""

    @staticmethod
    def host_footprint(branching: bool) -> Footprint:
        return Footprint(processes=1.5, descriptors=2.5, namespaces=0.5,
                         memory_bytes=(available_memory() or 1 << 34) / 20.5)


def test_too_many_live_units_of_a_fractional_footprint_is_a_one_line_error():
    with pytest.raises(ConfigError, match=r"expected max_live at most \d+ .*processes and \d+ MiB each\), got 10000"):
        EnvServer(f"{__name__}:FractionalParityEnv", limits=ServeLimits(max_live=10_000))
