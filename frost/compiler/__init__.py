"""The compile boundary: compile, persistent cache, fingerprint, loading, symbol names and parallel workers.

Knows kernel templates only by dotted path and by their TemplateParams records;
nothing here imports cutlass at import time.
"""
