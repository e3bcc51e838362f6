"""What `flashgen.load` of a spec costs, the module already built: in a new process
(run this twice; the first run builds and caches the module) and again in the same one.

    python scripts/load_time.py [SPEC]      # default examples/bloom_alibi.attn

Prints the import of torch and triton (a notebook pays it anyway), then the load's
parts as `flashgen.load` runs them: importing flashgen.api, reading, parsing and
checking the spec, rendering the module's source, and running it from the cache
(Triton reading its kernels' sources, torch.library registering its operators);
then a second `load` of the same spec, as a path and as text.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

# This checkout's flashgen, as the other scripts.
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def main() -> None:
    spec = Path(sys.argv[1] if len(sys.argv) > 1 else "examples/bloom_alibi.attn")
    os.environ.setdefault("TRITON_INTERPRET", "1")
    times = {}

    def timed(what, fn, *args, **kwargs):
        start = time.perf_counter()
        result = fn(*args, **kwargs)
        times[what] = time.perf_counter() - start
        return result

    timed("import torch, triton", lambda: (__import__("torch"), __import__("triton")))
    api = timed("import flashgen.api", __import__, "flashgen.api").api
    from flashgen.sidecar import tuning_for

    sources = timed("read the spec", api._read_specs, [spec])
    (variant,), _ = timed("parse and check", api.check_sources, sources)
    # As build_sources calls it, so that the second load finds it in _render's cache.
    source = timed(
        "render the module", api._render, variant, tuning_for(variant), triton_only=False
    )
    timed("run it from the cache", api._import, variant.name, source)
    timed("load again: the path", api.load, spec)
    timed("load again: the text", api.load, spec.read_text())
    for what, seconds in times.items():
        print(f"{what:24} {seconds * 1e3:9.2f} ms")


if __name__ == "__main__":
    main()
