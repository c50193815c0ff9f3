"""The graph layer: tensors, SDPA nodes, validation and the facts record. Knows nothing below it."""
