"""Kernel templates by feature arch, their TemplateParams and validators, and the adapter-kernel argument contract.

Nothing here imports cutlass at import time; template modules load lazily by dotted path.
"""
