"""Command-line entry points (see [project.scripts] in pyproject.toml)."""
