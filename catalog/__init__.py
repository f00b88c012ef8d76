"""Catalog: database access, checkpoint reading and ingestion."""
