"""Shared test configuration: Hypothesis profiles.

``ci`` (selected when CI=true, or with --hypothesis-profile=ci) is deterministic and bounded;
``dev`` is the everyday profile; ``slow`` searches long and is meant for ``-m slow`` runs.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    deadline=None,
    max_examples=60,
    derandomize=True,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("dev", deadline=None, max_examples=100)
settings.register_profile("slow", deadline=None, max_examples=2000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))
