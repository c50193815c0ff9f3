"""The `frost` command: `frost demo`, `frost bench`, `frost precompile`."""
from __future__ import annotations

import sys


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    usage = "usage: frost {demo,bench,precompile} [options]   (frost <command> --help for each)"
    if not argv or argv[0] in ("-h", "--help"):
        print(usage)
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd == "demo":
        from frost.demo import main as run
    elif cmd == "bench":
        from frost.bench.cli import main as run
    elif cmd == "precompile":
        from frost.plans.precompile import main as run
    else:
        print(f"frost: unknown command {cmd!r}\n{usage}", file=sys.stderr)
        return 2
    return int(run(rest) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
