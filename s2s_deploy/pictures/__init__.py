"""Pictures: attention maps from the exported graphs, and charts."""
