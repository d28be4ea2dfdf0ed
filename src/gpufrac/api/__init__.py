"""The control API (FastAPI)."""
