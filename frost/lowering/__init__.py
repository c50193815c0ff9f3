"""The lowering pass: facts -> ranked (engine, knobs) -> a built plan."""
