export PYTHONPATH=src:packages/graph/src:packages/capture/src:packages/autograd/src:packages/decomp/src:packages/inductor/src:packages/runtime/src:.:gpu_deps
T=$(mktemp -d)
( export KILN_CACHE_DIR=$T/c1 TRITON_CACHE_DIR=$T/t1 TORCHINDUCTOR_CACHE_DIR=$T/i1; timeout 120 python3 _x/load_prof.py save gpt2 $T/gpt2.art 2>&1 | tail -2 )
( export KILN_CACHE_DIR=$T/c2 TRITON_CACHE_DIR=$T/t2 TORCHINDUCTOR_CACHE_DIR=$T/i2; timeout 100 python3 _x/load_prof.py prof gpt2 $T/gpt2.art > $OUT/load_prof.txt 2>&1; head -3 $OUT/load_prof.txt )
( export KILN_CACHE_DIR=$T/c2 TRITON_CACHE_DIR=$T/t2 TORCHINDUCTOR_CACHE_DIR=$T/i2; timeout 100 python3 _x/load_prof.py prof gpt2 $T/gpt2.art > $OUT/load_prof_warm.txt 2>&1; head -3 $OUT/load_prof_warm.txt )
for m in convnext_tiny vit_base_patch16_224; do timeout 100 python3 -m benchmarks.compile_time --device cuda --first-compile --kiln-only --models $m --modes inference --timeout 80 --out $OUT/ct_$m > $OUT/ct_$m.log 2>&1; grep -h "^| inference" $OUT/ct_$m/compile_time.md; done
timeout 150 python3 -m pytest -q -x tests/test_gpu_warm_pool.py packages/inductor/tests/codegen/triton/test_compile_pool.py -p no:cacheprovider 2>&1 | tail -3
