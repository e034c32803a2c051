"""OpenEnv's server module for this checkout (``openenv validate .``): the ``server`` entry point,
`trace_gym.training.cli.serve.main`, which serves the env that ``TRACE_GYM_ENV`` names."""

from trace_gym.training.cli import serve


def main() -> int:
    """Serve as the environment variables ask (`trace_gym.training.cli.serve`)."""
    return serve.main()


if __name__ == "__main__":
    raise SystemExit(main())
