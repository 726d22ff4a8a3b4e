#!/usr/bin/env bash
# Set up (idempotent) and run the default pipeline end to end on this machine.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
. .venv/bin/activate
omni-edge run configs/voice-assistant.yaml \
  --prompt "${PROMPT:-Tell me one fact about the Moon.}" --out "${OUT:-reply.wav}" "$@"
