"""`qkv demo`: train a small date translator in about a minute, then show what it learned."""

from __future__ import annotations

import argparse
import time

from qkv.tasks.demo import DemoResult, run_demo


def run(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    result = run_demo(args.out, minutes=args.minutes, seed=args.seed)
    print_result(result, time.perf_counter() - start)
    return 0


def print_result(result: DemoResult, seconds: float) -> None:
    """Examples, accuracy and where the files are, for a person reading a terminal."""
    print()
    width = max((len(example.source) for example in result.examples), default=0)
    for example in result.examples:
        mark = "✓" if example.correct else f"✗ (expected {example.reference})"
        print(f"  {example.source:<{width}}  →  {example.output}  {mark}")
    print()
    print(f"exact-match accuracy on held-out dates: {result.accuracy:.1%}")
    print(f"done in {seconds:.0f} s")
    paths = result.paths
    print(f"attention maps:  {paths['attention']}")
    print(f"training curves: {paths['curves']}")
    print(f"run:             {paths['run']}")
    print(f'try: echo "July 4, 1976" | qkv translate {paths["run"]} --beam 1')
    print(f'     qkv attention {paths["run"]} "Mar. 3, 2021" --out attention.png --layers 1')
