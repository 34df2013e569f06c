"""GPU load profile: python _x/load_prof.py save|prof MODEL PATH"""
import cProfile, pstats, sys, time, io
import torch
from benchmarks import warm_start as W
from benchmarks.kiln_bench import backends as B
from benchmarks.kiln_bench import measure as M
what, model, path = sys.argv[1:4]
if what == "save":
    print(W.save_artifact(backend="kiln", model=model, small=False, device="cuda", path=path,
                          kiln_backend="inductor", tc_backend="inductor"))
    sys.exit(0)
case = W._case(model, False, "cuda")
B.import_kiln()
M.sync("cuda")
prof = cProfile.Profile()
t0 = time.perf_counter()
prof.enable()
with torch.no_grad():
    loaded = W._load("kiln", path)
    t1 = time.perf_counter()
    out = loaded(case.model, *case.args, **case.kwargs)
    torch.cuda.synchronize()
prof.disable()
t2 = time.perf_counter()
print(f"load {t1-t0:.3f} s, first call {t2-t1:.3f} s, total {t2-t0:.3f}")
t3 = time.perf_counter()
with torch.no_grad():
    loaded(case.model, *case.args, **case.kwargs); torch.cuda.synchronize()
print(f"second call {time.perf_counter()-t3:.4f}")
s = io.StringIO()
st = pstats.Stats(prof, stream=s); st.sort_stats("cumulative").print_stats(45)
st.sort_stats("tottime").print_stats(25)
print("\n".join(l[:200] for l in s.getvalue().splitlines()))
