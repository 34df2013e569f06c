#!/usr/bin/env bash
# The GPU benchmark run for the integrator: eager vs kiln vs torch.compile on the model suite
# (inference bf16, training AMP bf16) plus the bs=1 decode benchmark, in parts of about 8 minutes.
#
#   OUT=/some/folder bash benchmarks/gpu_suite.sh            # PART=1 (default)
#   PART=2 OUT=/other/folder bash benchmarks/gpu_suite.sh
#   PART=3 OUT=/third/folder bash benchmarks/gpu_suite.sh
#   python3 -m benchmarks.merge /some/folder/suite.json /other/folder/suite.json \
#       /third/folder/suite.json --out /merged                 # one table + chart for all 16 rows
#
# Cold compiles of 8 models x 2 modes by two compilers do not fit one 8-minute call on one GPU
# (torch.compile alone takes 10-20 s per inference row and about twice that per training row on an
# H200), so the suite comes in three parts, each within TOTAL_BUDGET_S:
#   PART=1   decode benchmark + inference of all 8 models
#   PART=2   training of resnet50, mobilenet_v3_large, vit_base_patch16_224, convnext_tiny
#   PART=3   training of bert_base, gpt2, llama_350m, t5_small
#   PART=all decode + everything (give it TOTAL_BUDGET_S=1500 and a longer call)
# Runs from a copy of the repository with plain python3 (torch, triton, torchvision, timm,
# transformers installed; no package registry needed). Writes into $OUT, flat (at most 7 files):
#   gpu_suite.log  suite.md  suite.json  suite_speedup.png  decode.md  decode.json  logs.tar.gz
# Knobs (defaults in brackets): TOTAL_BUDGET_S [480] -- the suite stops starting rows that would
# overrun it (they say "not run: budget"); SUITE_MODELS and SUITE_MODES override the part's lists;
# SUITE_ITERS [20]; KILN_BACKEND [inductor]; COMPILE_MODE [default]; PARTS [from PART]; PYTHON [python3].
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="src:packages/graph/src:packages/capture/src:packages/autograd/src:packages/decomp/src:packages/inductor/src:packages/runtime/src:.:gpu_deps${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
: "${OUT:?set OUT to the output folder}"
PY=${PYTHON:-python3}
TOTAL=${TOTAL_BUDGET_S:-480}
VISION=resnet50,mobilenet_v3_large,vit_base_patch16_224,convnext_tiny
TEXT=bert_base,gpt2,llama_350m,t5_small
case "${PART:-1}" in
  1)   P_MODELS=$VISION,$TEXT; P_MODES=inference; P_PARTS=decode,suite ;;
  2)   P_MODELS=$VISION;       P_MODES=training;  P_PARTS=suite ;;
  3)   P_MODELS=$TEXT;         P_MODES=training;  P_PARTS=suite ;;
  all) P_MODELS=$VISION,$TEXT; P_MODES=inference,training; P_PARTS=decode,suite ;;
  *)   echo "PART must be 1, 2, 3 or all (got '${PART}')" >&2; exit 2 ;;
esac
MODELS=${SUITE_MODELS:-$P_MODELS}
MODES=${SUITE_MODES:-$P_MODES}
PARTS=${PARTS:-$P_PARTS}
ITERS=${SUITE_ITERS:-20}
KB=${KILN_BACKEND:-inductor}
MODE_ARGS=()
if [[ -n "${COMPILE_MODE:-}" ]]; then MODE_ARGS=(--compile-mode "$COMPILE_MODE"); fi
WORK=$(mktemp -d /tmp/kiln_gpu_suite.XXXXXX)
mkdir -p "$OUT"
LOG="$OUT/gpu_suite.log"
{
  echo "# kiln gpu_suite PART=${PART:-1} ($MODES: $MODELS; $PARTS) $(date -u '+%Y-%m-%d %H:%M UTC'), git $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
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
  # A row started near the end of the budget gets at most ~60 s more (benchmarks.run caps its
  # timeout), so reserving 60 s keeps the whole script near TOTAL_BUDGET_S.
  SUITE_BUDGET=$(( TOTAL - SECONDS - 60 ))
  if (( SUITE_BUDGET < 60 )); then SUITE_BUDGET=60; fi
  echo "== model suite (budget ${SUITE_BUDGET}s for starting rows) ==" | tee -a "$LOG"
  "$PY" -m benchmarks.run --device cuda --models "$MODELS" --modes "$MODES" --iters "$ITERS" \
      --warmup 3 --kiln-backend "$KB" ${MODE_ARGS[@]+"${MODE_ARGS[@]}"} --budget-s "$SUITE_BUDGET" --timeout 180 \
      --out "$WORK/suite" 2>&1 | tee -a "$LOG"
fi

for f in suite/suite.md suite/suite.json suite/suite_speedup.png decode/decode.md decode/decode.json; do
  [[ -f "$WORK/$f" ]] && cp "$WORK/$f" "$OUT/"
done
tar -czf "$OUT/logs.tar.gz" -C "$WORK" . 2>/dev/null
rm -rf "$WORK"
echo "== done in ${SECONDS}s; results in $OUT ==" | tee -a "$LOG"
