"""The ``trace-gym`` command: ``main`` dispatches to one module per command group."""
