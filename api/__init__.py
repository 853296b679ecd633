"""dpsweep REST API (FastAPI). Empty until the API issue lands."""
