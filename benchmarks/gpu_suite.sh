#!/usr/bin/env bash
# The GPU benchmark run for the integrator: the decode benchmark, then the model suite
# (eager vs kiln vs torch.compile, inference bf16 + training AMP bf16), in about 8 minutes.
#
#   OUT=/some/folder bash benchmarks/gpu_suite.sh
#
# Runs from a copy of the repository with plain python3 (torch, triton, torchvision, timm,
# transformers installed; no package registry needed). Writes into $OUT, flat (at most 8 files):
#   gpu_suite.log  suite.md  suite.json  suite_speedup.png  decode.md  decode.json  logs.tar.gz
# Environment knobs (defaults in brackets):
#   TOTAL_BUDGET_S [480]  wall-clock target for the whole script; the suite stops starting new rows
#                         when it would overrun (rows not reached say "not run: budget")
#   SUITE_MODELS [all 8]  SUITE_MODES [inference,training]  SUITE_ITERS [20]
#   KILN_BACKEND [inductor]  COMPILE_MODE [default]  PARTS [decode,suite]  PYTHON [python3]
# To cover rows a short budget left out, run again with e.g. SUITE_MODES=training PARTS=suite.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="src:packages/graph/src:packages/capture/src:packages/autograd/src:packages/decomp/src:packages/inductor/src:packages/runtime/src:.${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
: "${OUT:?set OUT to the output folder}"
PY=${PYTHON:-python3}
TOTAL=${TOTAL_BUDGET_S:-480}
MODELS=${SUITE_MODELS:-resnet50,mobilenet_v3_large,vit_base_patch16_224,convnext_tiny,bert_base,gpt2,llama_350m,t5_small}
MODES=${SUITE_MODES:-inference,training}
ITERS=${SUITE_ITERS:-20}
KB=${KILN_BACKEND:-inductor}
PARTS=${PARTS:-decode,suite}
MODE_ARGS=()
if [[ -n "${COMPILE_MODE:-}" ]]; then MODE_ARGS=(--compile-mode "$COMPILE_MODE"); fi
WORK=$(mktemp -d /tmp/kiln_gpu_suite.XXXXXX)
mkdir -p "$OUT"
LOG="$OUT/gpu_suite.log"
{
  echo "# kiln gpu_suite $(date -u '+%Y-%m-%d %H:%M UTC'), git $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 || true
  "$PY" -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name() if torch.cuda.is_available() else 'NO GPU')" 2>&1
  "$PY" -c "import kiln; print('kiln.compile:', hasattr(kiln, 'compile'), 'backends:', kiln.list_backends() if hasattr(kiln, 'list_backends') else 'n/a')" 2>&1 | tail -1
} | tee "$LOG"

if [[ ",$PARTS," == *",decode,"* ]]; then
  echo "== decode (bs=1, ms/token) ==" | tee -a "$LOG"
  "$PY" -m benchmarks.decode --device cuda --tokens 256 --runs 3 --timeout 150 \
      --kiln-backend "$KB" --out "$WORK/decode" 2>&1 | tee -a "$LOG"
fi

if [[ ",$PARTS," == *",suite,"* ]]; then
  # Leave ~100 s for the rows still running when the budget runs out and for writing reports.
  SUITE_BUDGET=$(( TOTAL - SECONDS - 100 ))
  if (( SUITE_BUDGET < 60 )); then SUITE_BUDGET=60; fi
  echo "== model suite (budget ${SUITE_BUDGET}s for starting rows) ==" | tee -a "$LOG"
  "$PY" -m benchmarks.run --device cuda --models "$MODELS" --modes "$MODES" --iters "$ITERS" \
      --warmup 3 --kiln-backend "$KB" "${MODE_ARGS[@]}" --budget-s "$SUITE_BUDGET" --timeout 180 \
      --out "$WORK/suite" 2>&1 | tee -a "$LOG"
fi

for f in suite/suite.md suite/suite.json suite/suite_speedup.png decode/decode.md decode/decode.json; do
  [[ -f "$WORK/$f" ]] && cp "$WORK/$f" "$OUT/"
done
tar -czf "$OUT/logs.tar.gz" -C "$WORK" . 2>/dev/null
echo "== done in ${SECONDS}s; results in $OUT ==" | tee -a "$LOG"
