#!/usr/bin/env bash
# Profiles on the GPU machine (integrator's tool): host + device breakdown per model into $OUT.
#   OUT=dir PROFILES="decode:kiln:reduce-overhead resnet50:kiln:" bash benchmarks/gpu_profile.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="src:packages/graph/src:packages/capture/src:packages/autograd/src:packages/decomp/src:packages/inductor/src:packages/runtime/src:.:gpu_deps${PYTHONPATH:+:$PYTHONPATH}"
: "${OUT:?set OUT}"
for p in ${PROFILES:-decode:kiln:reduce-overhead}; do
  IFS=: read -r model backend mode extra <<<"$p"
  args=(--model "$model" --backend "$backend" --out "$OUT" --iters "${ITERS:-20}")
  [[ -n "$mode" ]] && args+=(--mode "$mode")
  [[ "$extra" == "train" ]] && args+=(--training)
  dbg="$OUT/debug-$model-$backend"
  [[ -n "${DEBUG:-}" ]] && export KILN_DEBUG_DIR="$dbg" || unset KILN_DEBUG_DIR
  timeout "${EACH_S:-150}" python3 -m benchmarks.profile_step "${args[@]}" 2>&1 | grep -v "^USDT\|^ERROR:.*DeviceProperties\|Profiler clears\|_warn_once" | tail -${TAIL:-40}
  [[ -d "$dbg" ]] && tar czf "$dbg.tgz" -C "$OUT" "$(basename "$dbg")" && rm -rf "$dbg"
done
