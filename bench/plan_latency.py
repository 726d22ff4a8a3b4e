"""Planning latency: in-process plan time and cold CLI wall time.

Targets (issue 2): <= 50 ms in-process, <= 1.0 s cold CLI on a 2-core machine.

    python bench/plan_latency.py [--repeat 30]

Prints, side by side in one run:
* in-process ``plan_pipeline`` time (median of --repeat runs, after one warm-up)
  for the default pipeline and for a 4-shard checkpoint (Llama-3.1-8B's tensor
  layout split into 4 safetensors files whose headers are real and whose data
  regions are sparse: the planner reads only headers);
* cold CLI wall time of ``omni-edge plan`` (fresh interpreter each time), with
  ``--profile`` and with this machine's probe.
"""

from __future__ import annotations

import argparse
import json
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from orchestrator.config import load_config  # noqa: E402
from orchestrator.planner import plan_pipeline  # noqa: E402
from orchestrator.profile import load_profile  # noqa: E402

CPU_PROFILE = REPO / "configs/profiles/cpu-only-linux.json"
GPU_PROFILE = REPO / "configs/profiles/strix-point-rtx5090-wsl.json"


def llama8b_four_shards(root: Path) -> Path:
    """config.json + 4 safetensors files in Llama-3.1-8B's layout (sparse data)."""
    cfg = {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 4096,
        "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 131072,
        "torch_dtype": "bfloat16",
    }
    h, inter, kvh, hd, vocab = 4096, 14336, 8, 128, 128256
    tensors: list[tuple[str, list[int]]] = [("model.embed_tokens.weight", [vocab, h])]
    for i in range(32):
        p = f"model.layers.{i}."
        tensors += [
            (p + "self_attn.q_proj.weight", [h, h]), (p + "self_attn.k_proj.weight", [kvh * hd, h]),
            (p + "self_attn.v_proj.weight", [kvh * hd, h]), (p + "self_attn.o_proj.weight", [h, h]),
            (p + "mlp.gate_proj.weight", [inter, h]), (p + "mlp.up_proj.weight", [inter, h]),
            (p + "mlp.down_proj.weight", [h, inter]), (p + "input_layernorm.weight", [h]),
            (p + "post_attention_layernorm.weight", [h]),
        ]
    tensors += [("model.norm.weight", [h]), ("lm_head.weight", [vocab, h])]
    d = root / "llama-3.1-8b-layout"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    per = (len(tensors) + 3) // 4
    for k in range(4):
        header, off = {}, 0
        for name, shape in tensors[k * per:(k + 1) * per]:
            n = 2
            for s in shape:
                n *= s
            header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [off, off + n]}
            off += n
        raw = json.dumps(header).encode()
        with (d / f"model-{k + 1:05d}-of-00004.safetensors").open("wb") as f:
            f.write(struct.pack("<Q", len(raw)) + raw)
            f.truncate(8 + len(raw) + off)
    cfg_path = root / "llama8b.yaml"
    cfg_path.write_text(f"name: llama8b\nstages:\n  - {{name: thinker, kind: ar_decode, model: {d}, devices: [gpu:0, cpu], max_model_len: 8192, final_output: true}}\n")
    return cfg_path


def median_ms(fn, repeat: int) -> float:
    fn()  # warm-up: module imports, first file reads
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def first_ms(fn) -> float:
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1000


def cli_seconds(args: list[str], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], cwd=REPO, capture_output=True, check=False)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--cli-repeat", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        four = llama8b_four_shards(Path(tmp))
        default = REPO / "configs/voice-assistant.yaml"
        cpu, gpu = load_profile(CPU_PROFILE), load_profile(GPU_PROFILE)
        rows = []
        for label, cfg_path, profile in (("default pipeline (cpu-only profile)", default, cpu),
                                          ("4-shard Llama-3.1-8B layout (RTX 5090 profile)", four, gpu)):
            cold = first_ms(lambda p=cfg_path, pr=profile: plan_pipeline(load_config(p), pr))
            med = median_ms(lambda p=cfg_path, pr=profile: plan_pipeline(load_config(p), pr), args.repeat)
            rows.append((label, cold, med))
        print(f"{'in-process plan (load config + plan)':<50} {'first':>9} {'median':>9} {'target':>8} {'ratio':>7}")
        for label, cold, med in rows:
            print(f"{label:<50} {cold:7.1f}ms {med:7.1f}ms {50:6d}ms {med / 50:6.2f}x")
        print()
        cli_profile = cli_seconds(["plan", str(default), "--profile", str(CPU_PROFILE), "--json"], args.cli_repeat)
        cli_probe = cli_seconds(["plan", str(default), "--json"], args.cli_repeat)
        title = f"cold CLI wall time (median of {args.cli_repeat})"
        print(f"{title:<50} {'seconds':>9} {'target':>9} {'ratio':>7}")
        print(f"{'omni-edge plan default --profile cpu-only':<50} {cli_profile:8.2f}s {1.0:8.1f}s {cli_profile:6.2f}x")
        print(f"{'omni-edge plan default (probes this machine)':<50} {cli_probe:8.2f}s {1.0:8.1f}s {cli_probe:6.2f}x")


if __name__ == "__main__":
    main()
