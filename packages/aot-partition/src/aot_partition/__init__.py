"""aot_partition."""
