"""aot_pipeline: the full torch.compile pipeline built from the aot-* packages."""
