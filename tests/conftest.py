"""Test-wide settings. Hypothesis draws the same examples on every run and machine (the "ci" profile:
derandomized, no example database), so the test command passes or fails the same way everywhere. To explore new
examples locally: ``HYPOTHESIS_PROFILE=explore pytest ...``."""

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, database=None, deadline=None, print_blob=True)
settings.register_profile("explore", deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
