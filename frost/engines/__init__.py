"""Kernel templates by feature arch, their params, the compile boundary and target discovery.

Nothing here imports cutlass at import time; template modules load lazily.
"""
