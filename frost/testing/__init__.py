"""What the tests, tools and benchmark scripts share: kernel case lists and direct kernel runners.

Production code so that nothing outside test/ imports a test module; nothing in frost imports it.
"""
