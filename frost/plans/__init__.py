"""Plans outside one process: saved plan files (format, save / load) and ahead-of-time precompile."""
