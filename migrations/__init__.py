"""Alembic migrations of the dpsweep database (run with ``dpsweep db upgrade``)."""
