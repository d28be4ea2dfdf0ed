"""The ``gpufrac`` command (Typer + Rich)."""
