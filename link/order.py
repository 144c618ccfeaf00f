#!/usr/bin/env python3
"""Turns callgrind's records of a `moat` binary (link/profile.py) into
link/moat.order: the mangled name of every function of the binary that
ran, in the order each record lists them (callgrind's own order, grouped
by object and source file), the records taken in turn. Only names the
binary defines are kept; an order with none is refused.

  order.py MOAT RECORDING...   the order file, on stdout
  order.py --check MOAT ORDER  how much of ORDER the binary MOAT defines,
                               and the span its text covers: the span is
                               small when the order was applied
"""

import re
import subprocess
import sys


def defined(binary):
    """The binary's functions: name -> (address, size)."""
    out = subprocess.run(["nm", "-S", "--defined-only", binary], capture_output=True,
                         text=True, check=True).stdout
    functions = {}
    for line in out.splitlines():
        fields = line.split()
        if len(fields) == 4 and fields[2] in "tTwW":
            functions[fields[3]] = (int(fields[0], 16), int(fields[1], 16))
    return functions


def ran(recording, binary):
    """The functions of `binary` (the names it may be recorded under) that
    ran, in callgrind's order."""
    objects, functions, current, names = {}, {}, None, []
    # callgrind names an object or function once, then by number only.
    entry = re.compile(r"(c?ob|c?fn)=\((\d+)\)(?: (.*))?$")
    with open(recording) as f:
        for line in f:
            found = entry.match(line.rstrip("\n"))
            if not found:
                continue
            kind, number, name = found.groups()
            table = objects if kind.endswith("ob") else functions
            if name:
                table[number] = name
            if kind == "ob":
                current = objects[number]
            elif kind == "fn" and current in binary:
                # 'N marks a recursion depth: the same function.
                names.append(re.sub(r"'\d+$", "", functions[number]))
    return names


def main():
    if sys.argv[1] == "--check":
        binary, order = sys.argv[2:4]
        functions = defined(binary)
        with open(order) as f:
            wanted = [l.strip() for l in f if l.strip() and not l.startswith("#")]
        found = [functions[n] for n in wanted if n in functions]
        if not found:
            sys.exit(f"order.py: {binary} defines none of the {len(wanted)} functions of {order}")
        size = sum(s for _, s in found)
        span = max(a + s for a, s in found) - min(a for a, _ in found)
        print(f"{binary} defines {len(found)} of the {len(wanted)} functions of {order} "
              f"({100 * len(found) / len(wanted):.1f}%): {size / 1e6:.2f} MB of code "
              f"within {span / 1e6:.2f} MB of text")
        return
    binary, recordings = sys.argv[1], sys.argv[2:]
    functions = defined(binary)
    import os
    names = {binary, os.path.abspath(binary), os.path.realpath(binary)}
    seen, order = set(), []
    for recording in recordings:
        for name in ran(recording, names):
            if name in functions and name not in seen:
                seen.add(name)
                order.append(name)
    if not order:
        sys.exit(f"order.py: the records name no function of {binary}")
    print("# The order of the `moat` binary's hot functions: lld's --symbol-ordering-file,")
    print("# passed by build.rs. Written by link/order.sh; do not edit.")
    print(f"# {len(order)} functions, {sum(functions[n][1] for n in order)} bytes.")
    print("\n".join(order))


main()
