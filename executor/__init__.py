"""Streaming executor: reads the planned expert blocks, merges block by block, publishes atomically."""
