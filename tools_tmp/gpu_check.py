import sys, time, torch
print("torch", torch.__version__, "cuda", torch.cuda.is_available())
from kiln.decomp.opinfo_check import check_all
for tab in ("core_aten", "prims"):
    t = time.time()
    rep = check_all(tab, device="cuda")
    print(tab, "cuda:", len(rep.checked), "matched,", len(rep.failures), "mismatches, %.0fs" % (time.time() - t))
    seen = set()
    for f in rep.failures:
        k = f[:90]
        if k in seen: continue
        seen.add(k); print("  FAIL", f[:300])
