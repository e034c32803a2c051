"""OpenEnv's server module for this checkout (``openenv validate .``): the ``server`` entry point,
`trace_gym.integrations.openenv_server.main`, which serves the env that ``TRACE_GYM_ENV`` names."""

from trace_gym.integrations import openenv_server


def main() -> int:
    """Serve as the environment variables ask (`trace_gym.integrations.openenv_server`)."""
    return openenv_server.main()


if __name__ == "__main__":
    raise SystemExit(main())
