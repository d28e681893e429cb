"""compiled_autograd."""
