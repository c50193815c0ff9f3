"""Runtime: ExecutionContext, stream resolution, binding checks and workspace carving."""
