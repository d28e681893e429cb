"""aot_compilers."""
