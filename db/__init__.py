"""radcaliper `db` package: filled in by later issues (see README "Architecture")."""

__all__: list[str] = []
