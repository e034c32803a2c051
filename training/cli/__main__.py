"""``python -m trace_gym.training.cli`` (what torchrun launches) is the ``trace-gym`` command."""

from trace_gym.training.cli.main import main

raise SystemExit(main())
