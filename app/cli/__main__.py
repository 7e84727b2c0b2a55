"""``python -m app.cli``: the ``radcaliper`` command line."""

from app.cli import main

main()
