"""The semantic end of turn's scores: finished questions against questions cut mid-way.

    python bench/turn_scores.py [--config configs/examples/voice-chat.yaml] [--json]

``semantic_vad`` ends a turn after the short pause when the thinker's own model scores the
transcript as a finished message at or above the eagerness's threshold
(``orchestrator/server/realtime_turn_end.py``), after the long one below it. This prints the
scores :class:`~stages.ar_decode.engines.llamacpp_turn.LlamaCppTurnScorer` gives, with the
config's thinker and system prompt, to

* **finished**: the held-out questions of ``bench/voice_latency.py`` (``QUESTIONS``) and the
  whole of each question with a pause inside (``PAUSED``, its two phrases joined);
* **cut**: the first phrase of each question with a pause inside — where ``server_vad`` at
  400 ms cut it;

with each group's lowest, median and highest score, and for each eagerness how many of each
group its threshold takes as finished. Text only (no audio, no Whisper): the scorer reads
transcripts. Scores are the model's and move a little with the CPU's kernels; the
thresholds' margins are what to read.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from voice_latency import PAUSED, QUESTIONS  # noqa: E402

from orchestrator.config import load_config  # noqa: E402
from orchestrator.server.realtime_turn_end import EAGERNESS  # noqa: E402
from stages.ar_decode.engines.llamacpp_turn import LlamaCppTurnScorer  # noqa: E402
from stages.ar_decode.gguf_vocab import gguf_path  # noqa: E402


def groups() -> dict[str, list[str]]:
    return {
        "finished": [*QUESTIONS, *(f"{a} {b}" for a, b in PAUSED)],
        "cut": [a for a, _ in PAUSED],
    }


def bench(config_path: Path) -> dict[str, Any]:
    config = load_config(config_path)
    thinker = next(s for s in config.stages if s.kind == "ar_decode")
    # as the llama.cpp engine builds it for the stage (LlamaCppEngine.turn_scorer)
    scorer = LlamaCppTurnScorer(gguf_path(str(thinker.model)), thinker.system_prompt)
    scorer.load()
    try:
        scores = {name: [scorer.complete(t) for t in texts] for name, texts in groups().items()}
    finally:
        scorer.close()
    return {
        "config": str(config_path),
        "stage": thinker.name,
        "groups": {
            name: {
                "n": len(s),
                "min": min(s),
                "median": statistics.median(s),
                "max": max(s),
                "scores": s,
            }
            for name, s in scores.items()
        },
        "eagerness": {
            name: {
                "threshold": p.threshold,
                "finished_taken": sum(v >= p.threshold for v in scores["finished"]),
                "cut_taken": sum(v >= p.threshold for v in scores["cut"]),
            }
            for name, p in EAGERNESS.items()
        },
    }


def report(result: dict[str, Any]) -> None:
    print(f"{result['config']}: the {result['stage']} stage's model scores each transcript")
    print(f"{'group':>10} {'n':>4} {'min':>8} {'median':>8} {'max':>8}")
    for name, g in result["groups"].items():
        print(f"{name:>10} {g['n']:>4} {g['min']:>8.4f} {g['median']:>8.4f} {g['max']:>8.4f}")
    n_fin, n_cut = (result["groups"][k]["n"] for k in ("finished", "cut"))
    for name, e in result["eagerness"].items():
        print(
            f"{name}: threshold {e['threshold']}: finished taken {e['finished_taken']} of "
            f"{n_fin}, cut taken as finished {e['cut_taken']} of {n_cut}"
        )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--config",
        type=Path,
        default=REPO / "configs/examples/voice-chat.yaml",
        help="a pipeline whose ar_decode stage is a llama.cpp GGUF (default: voice-chat)",
    )
    p.add_argument("--json", action="store_true", help="print the whole result as JSON")
    args = p.parse_args()
    if not args.config.is_file():
        p.error(f"--config: no such file: {args.config}")
    result = bench(args.config)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        report(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
