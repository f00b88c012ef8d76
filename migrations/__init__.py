"""Numbered catalog migrations (NNNN_name.sql), package data applied in order by mergepipe.catalog.db."""
