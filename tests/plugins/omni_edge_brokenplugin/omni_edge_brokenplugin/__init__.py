"""A deliberately broken plugin (see this distribution's pyproject.toml)."""
