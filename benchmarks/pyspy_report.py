"""What a py-spy recording (`serve_gpu.py --py-spy DIR`: `--format raw --threads`, collapsed stacks) says a
process's threads did: samples per thread, and per thread the functions that held most samples, by their own
time (the innermost frame) and by the time under them (any frame of the stack).

    python benchmarks/pyspy_report.py /tmp/spy/pyspy-fleetllm-direct-concurrency32.txt [--top 15] [--thread NAME]
"""

from __future__ import annotations

import argparse
import collections
import re
from pathlib import Path

LINE = re.compile(r"^thread \((?P<tid>[^)]*)\): (?P<stack>.*) (?P<n>\d+)$")


def parse(path: Path) -> dict[str, list[tuple[list[str], int]]]:
    """{thread name (id): [(frames outermost first, samples)]} from py-spy's raw output."""
    out: dict[str, list[tuple[list[str], int]]] = collections.defaultdict(list)
    for line in path.read_text().splitlines():
        m = LINE.match(line.strip())
        if not m:
            continue
        name, *frames = m["stack"].split(";")
        out[f"{name} ({m['tid']})"].append((frames, int(m["n"])))
    return out


def short(frame: str) -> str:
    """`func (path/to/module.py:12)` -> `func (module.py:12)`."""
    name, _, where = frame.partition(" (")
    return f"{name} ({where.rsplit('/', 1)[-1]}" if where else name


def summarize(stacks: list[tuple[list[str], int]], top: int) -> dict:
    """Samples, and the `top` functions by own samples and by samples under them (each counted once a stack)."""
    own: collections.Counter = collections.Counter()
    under: collections.Counter = collections.Counter()
    total = 0
    for frames, n in stacks:
        total += n
        if frames:
            own[short(frames[-1])] += n
        for f in {short(f) for f in frames}:
            under[f] += n
    return {"samples": total, "own": own.most_common(top), "under": under.most_common(top)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--thread", default=None, help="only threads whose name contains this")
    args = ap.parse_args()
    for file in args.files:
        threads = parse(Path(file))
        print(f"== {file}: {sum(n for s in threads.values() for _, n in s)} samples")
        for name, stacks in sorted(threads.items(), key=lambda kv: -sum(n for _, n in kv[1])):
            if args.thread and args.thread not in name:
                continue
            s = summarize(stacks, args.top)
            print(f"-- {name}: {s['samples']} samples")
            for label in ("own", "under"):
                print(f"   by {label}:")
                for func, n in s[label]:
                    print(f"     {n:7d} {100 * n / s['samples']:5.1f}%  {func}")


if __name__ == "__main__":
    main()
