"""The HTTP API (FastAPI): ingestion and merge jobs, manifests, lineage, read-only SQL."""
