"""aot_config."""
