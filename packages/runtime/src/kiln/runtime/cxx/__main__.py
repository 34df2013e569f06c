"""``python -m kiln.runtime.cxx --cflags --ldflags``: flags to build a C++ program using ``kiln/runner.h``.

    g++ main.cpp $(python -m kiln.runtime.cxx --cflags --ldflags) -o main
    g++ main.cpp $(python -m kiln.runtime.cxx --cuda --cflags --ldflags) -o main   # runs CUDA packages too
"""

from __future__ import annotations

import argparse
import shlex
import sys

from .flags import INCLUDE_DIR, cflags, ldflags


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kiln.runtime.cxx", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cflags", action="store_true", help="include flags (torch's headers, kiln/runner.h)")
    ap.add_argument("--ldflags", action="store_true", help="link flags (libtorch_cpu, libc10, an rpath to them)")
    ap.add_argument("--includedir", action="store_true", help="the folder holding kiln/runner.h")
    ap.add_argument("--cuda", action="store_true", help="for CUDA packages: the CUDA headers (from the nvidia-* "
                    "wheels or triton), libtorch_cuda and libc10_cuda")
    args = ap.parse_args(argv)
    if not (args.cflags or args.ldflags or args.includedir):
        ap.print_help()
        return 2
    out: list[str] = []
    if args.includedir:
        out.append(str(INCLUDE_DIR))
    if args.cflags:
        out += cflags(cuda=args.cuda)
    if args.ldflags:
        out += ldflags(cuda=args.cuda)
    print(" ".join(shlex.quote(x) for x in out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
