"""Private building blocks of :mod:`ingestion.prepare`; import the public names from there."""
