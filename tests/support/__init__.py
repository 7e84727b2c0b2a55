"""What several test modules share: helpers, builders and fixtures.

Imported as ``tests.support.<module>``; no test module imports another test module.
"""
