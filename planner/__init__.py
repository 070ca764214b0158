"""Prefill planning, scheduling, paged KV blocks, prefix cache and SSM snapshot store."""
