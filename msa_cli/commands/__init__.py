"""The command line: one module per command group, over the engine (`msa.engine`)."""
