"""Test-wide settings. Under CI, hypothesis draws the same examples every run (derandomize), so a red CI
always reproduces; local runs keep exploring new examples."""

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, deadline=None)
if os.environ.get("CI"):
    settings.load_profile("ci")
