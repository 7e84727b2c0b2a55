"""Private parts of :mod:`ingestion.phantoms`: spec, truth records, layout, rendering, writers.

Import from :mod:`ingestion.phantoms`; the modules here may change without notice.
"""
