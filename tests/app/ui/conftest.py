"""The UI tests' fixtures: ``server`` (the review UI on a seeded store, one per module) and
``browser`` (Chromium through Playwright), from ``tests.support.ui``."""

from tests.support.ui import browser, server

__all__ = ["browser", "server"]
