"""The talker on the thinker's whole hand-over (``join: all``) against on its first steps
(``join: latest``, vLLM-Omni's async_chunk), on Ray, in one run.

    python bench/omni_handover.py [--thinker-tokens 200] [--talker-codes 64] [--repeat 3] [--json FILE]

The tiny Qwen2.5-Omni checkpoint (``python -m exports.omni_tiny build``), greedy, both stages on
the transformers backend on the CPU; the thinker's reply length is fixed (min_tokens =
max_tokens), so both variants do the same work whatever the tokens are. Reported (medians over
--repeat requests after one warm-up): the thinker's time to its last token, the time to the
talker's first code and to its last, each from the request's start; and the ratio of the
first-code times. The codes of the two variants are checked to be the same.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from exports import omni_tiny  # noqa: E402
from orchestrator.api import Pipeline  # noqa: E402
from orchestrator.runtime.events import OutputItem, StageEvent  # noqa: E402


def config(tmp: Path, join: str, thinker_tokens: int, talker_codes: int) -> Path:
    doc = yaml.safe_load((REPO / "configs/examples/qwen2_5-omni-tiny.yaml").read_text())
    doc["stages"] = [
        s for s in doc["stages"] if s["kind"] == "ar_decode"
    ]  # the hand-over: thinker → talker
    for stage in doc["stages"]:
        stage["model"] = str(omni_tiny.QWEN2_5_OMNI_DIR)
        if stage["name"] == "thinker":
            stage["sampling"].update(min_tokens=thinker_tokens, max_tokens=thinker_tokens)
            stage["max_model_len"] = thinker_tokens + 64
        else:
            stage["join"] = join
            stage["sampling"].update(min_tokens=talker_codes, max_tokens=talker_codes)
            stage["max_model_len"] = thinker_tokens + talker_codes + 64
    path = tmp / f"{join}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def measure(path: Path, repeat: int) -> dict[str, Any]:
    pipeline = Pipeline.from_config(path, record=None, calibration=False)
    rows = []
    codes: list[Any] = []
    try:
        for i in range(repeat + 1):

            async def one() -> tuple[dict[str, float], list[Any]]:
                t0 = time.perf_counter()
                first = last = thinker_done = None
                got = []
                async for e in pipeline.stream("Hello there"):
                    now = time.perf_counter() - t0
                    if isinstance(e, OutputItem) and e.stage == "talker":
                        got.append(list(e.value))
                        first = now if first is None else first
                        last = now
                    elif isinstance(e, StageEvent) and e.kind == "done" and e.stage == "thinker":
                        thinker_done = now
                return {
                    "thinker_done_s": thinker_done or 0.0,
                    "first_code_s": first or 0.0,
                    "last_code_s": last or 0.0,
                }, got

            row, got = asyncio.run(one())
            if i:  # the first is a warm-up
                rows.append(row)
            codes = got
    finally:
        pipeline.close()
    return {
        "median": {k: round(statistics.median(r[k] for r in rows), 4) for k in rows[0]},
        "codes": codes,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--thinker-tokens", type=int, default=200)
    parser.add_argument("--talker-codes", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    omni_tiny.ensure_built()
    with tempfile.TemporaryDirectory() as tmp:
        out = {
            join: measure(
                config(Path(tmp), join, args.thinker_tokens, args.talker_codes), args.repeat
            )
            for join in ("all", "latest")
        }
    same = out["all"]["codes"] == out["latest"]["codes"]
    ratio = out["latest"]["median"]["first_code_s"] / out["all"]["median"]["first_code_s"]
    for join in ("all", "latest"):
        m = out[join]["median"]
        print(
            f"join: {join:6}  thinker done {m['thinker_done_s']:.3f} s  first code {m['first_code_s']:.3f} s  "
            f"last code {m['last_code_s']:.3f} s"
        )
    print(f"first code, latest / all: {ratio:.2f}; codes identical: {same}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "thinker_tokens": args.thinker_tokens,
                    "talker_codes": args.talker_codes,
                    "all": out["all"]["median"],
                    "latest": out["latest"]["median"],
                    "first_code_ratio": round(ratio, 3),
                    "codes_identical": same,
                },
                indent=2,
            )
        )
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
