"""Stable frost symbols for compiled kernels, applied at the compile boundary.

CuTe DSL names a `@cute.kernel` entry from its Python name, mangled with the
argument types and a per-compile counter (`kernel_cutlass_<fn>_<types>_0`),
and the host entry likewise. The DSL chooses those names through two methods
of its DSL object: `_get_name_options(func)` (what `set_name_prefix` sets) and
`_customize_generated_name(...)`. While one frost compile runs, `kernel_symbols`
overrides both on that object, for the compiling thread and for functions left
at the default options only, so that:

- the host entry (and so the exported TVM-FFI symbol) is `name`;
- the first kernel launched is `name` (what a profiler shows);
- a further kernel is `name__<python function name>`, or whatever the template's
  optional `kernel_symbol(params, arch, index, fn_name)` returns.

Template authors do nothing special; a kernel whose author called
`set_name_prefix` keeps the author's choice.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import re
import threading

_SYMBOL = re.compile(r"^frost_[A-Za-z0-9_]+$")


def check_symbol(symbol: str) -> str:
    if not isinstance(symbol, str) or not _SYMBOL.match(symbol) or len(symbol) > 200:
        raise ValueError(f"kernel symbol {symbol!r} must match {_SYMBOL.pattern} (at most 200 characters)")
    return symbol


def default_kernel_symbol(name: str, index: int, fn_name: str) -> str:
    if index == 0:
        return name
    return f"{name}__{fn_name.strip('_') or 'kernel'}"


def unwrap(fn):
    """The function cute.compile traces for `fn` (a @cute.jit function, bound method or callable object)."""
    if inspect.ismethod(fn):
        fn = fn.__func__
    elif not inspect.isfunction(fn) and callable(fn):
        fn = type(fn).__call__
    while hasattr(fn, "__wrapped__"):
        fn = fn.__wrapped__
    return fn


@contextlib.contextmanager
def kernel_symbols(jit_fn, name: str, symbol_for=None):
    """Name the host entry and kernels of the next compile of `jit_fn` after `name`.

    `symbol_for(index, fn_name) -> str` overrides the policy for kernels.
    Yields a list that collects the kernel symbols actually issued.
    """
    check_symbol(name)
    symbols: list[str] = []
    try:
        from cutlass.base_dsl.dsl import BaseDSL, _NameOptions

        func = unwrap(jit_fn)
        BaseDSL._lazy_initialize_dsl(func)
        dsl = func._dsl_object
        orig_get = type(dsl)._get_name_options
        orig_customize = dsl._customize_generated_name
    except Exception as e:  # a DSL without these hooks: compile with its own names
        logging.getLogger(__name__).warning("frost: cannot apply kernel symbol %s (%s: %s)", name, type(e).__name__, e)
        dsl = None
    if dsl is None:
        yield symbols
        return
    default = _NameOptions()
    owner = threading.get_ident()
    issued: dict[int, tuple] = {}
    policy = symbol_for or (lambda index, fn_name: default_kernel_symbol(name, index, fn_name))

    def get_name_options(f):
        opts = orig_get(f)
        if threading.get_ident() != owner or opts != default:
            return opts
        if f is func:
            mine = _NameOptions(name_prefix=name, remove_cutlass_symbol=True, keep_mangled_name=False)
            issued[id(mine)] = (mine, None)
            return mine
        if getattr(f, "_decorator_kind", None) == "kernel":
            mine = _NameOptions(name_prefix=f.__name__, remove_cutlass_symbol=True, keep_mangled_name=False)
            issued[id(mine)] = (mine, f.__name__)
            return mine
        return opts

    def customize(default_name, name_options, unique_suffix=None):
        entry = issued.get(id(name_options))
        if entry is None or entry[0] is not name_options:
            return orig_customize(default_name, name_options, unique_suffix=unique_suffix)
        fn_name = entry[1]
        if fn_name is None:  # the host entry
            return name
        symbol = check_symbol(policy(int(unique_suffix or 0), fn_name))
        if symbol in symbols:
            symbol = check_symbol(f"{symbol}_{unique_suffix}")
        symbols.append(symbol)
        return symbol

    dsl._get_name_options = get_name_options
    dsl._customize_generated_name = customize
    try:
        yield symbols
    finally:
        for attr in ("_get_name_options", "_customize_generated_name"):
            dsl.__dict__.pop(attr, None)
