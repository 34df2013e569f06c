"""InductorOptions: everything that changes generated code, as one frozen value (its hash keys caches)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from .autotune_options import AutotuneOptions
from .knobs import KNOBS

WRAPPERS = ("python", "cpp", "tiered")


@dataclass(frozen=True, slots=True)
class MisalignedMatmuls:
    """Which matmuls count as large and misaligned (graph_passes/pad_matmuls.py says why they matter):
    on ``devices``, a static mm/addmm of at least ``min_macs`` multiply-adds with a dimension of at least
    ``min_dim`` elements that is not a multiple of 16 bytes. One whose result rows (N) are misaligned
    runs as kiln's Triton matmul template writing the unaligned result directly when ``template`` is on
    (matmul_templates.py ``template_misaligned_matmuls``); the others run on zero-padded operands
    (``InductorOptions.pad_matmuls``)."""

    devices: tuple[str, ...] = ("cuda",)
    min_macs: int = 1 << 30  # smaller products lose less to misalignment than a pad copy costs
    min_dim: int = 512  # a short misaligned dimension is cheap for cuBLAS
    template: bool = True


@dataclass(frozen=True, slots=True)
class InductorOptions:
    mode: str = "default"  # "default" | "reduce-overhead" | "max-autotune" | "max-autotune-no-cudagraphs"
    max_autotune: bool = False
    cxx: str = "g++"
    # -ffp-contract=off: g++ would fuse x * c - m into one fma, skipping the rounding eager does after
    # the multiply (softmax(x * 9000) was off by 1e-3); torch.compile's C++ defaults to off too.
    # -fwrapv: int32/int64 overflow wraps as in eager; without it g++ assumes it never happens and folds
    # (x + 1) > x to true and (x * 2) // 2 to x
    cpp_flags: tuple[str, ...] = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC",
                                  "-fno-math-errno", "-fno-trapping-math", "-ffp-contract=off", "-fwrapv")
    link_flags: tuple[str, ...] = ("-lmvec", "-lm")
    vectorize_math: bool = True  # use glibc's vector math (libmvec) for exp/log/tanh/... in simd loops
    parallel_threshold: int = 32768  # fewer elements than this run on one thread (OpenMP start-up costs)
    inline_max_size: int = 48  # a pointwise value used twice is recomputed when its body is this small
    # ... and reads at most this many whole buffers: a residual stream x = x + f(x) left lazy would be
    # re-summed from every earlier layer's output in each later consumer (quadratic reads)
    inline_max_reads: int = 2
    fuse: bool = True  # scheduler fusion on/off (off: one kernel per node; for debugging)
    # C++: consecutive independent pointwise kernels (an optimizer step over many parameters) launched as
    # one, over one flattened range in one parallel region (scheduler/horizontal.py)
    group_kernels: bool = True
    fallback_unknown_ops: bool = True  # run ops without lowering through ATen (logged in perf_hints)
    strict_lowering: bool = False  # a failing lowering rule raises instead of falling back (tests)
    verify: bool | None = None  # None: follow KILN_VERIFY
    # kernels for CPU tensors: "cpp" (C++/OpenMP) or "triton" (the Triton interpreter, TRITON_INTERPRET=1;
    # tests the GPU code path on CPU). CUDA tensors always get Triton kernels.
    cpu_backend: str = "cpp"
    # Triton backend: a one-row mm/addmm (bs=1 decoding) is a generated reduction fused with its
    # neighbours instead of a cuBLAS call (graph_passes/gemv_as_reduction.py)
    gemv_as_reduction: bool = True
    # Triton backend: attention of one query row per head (decoding) as kiln's Triton kernel instead of the
    # library call (decode_attention.py), the cache split over programs: 0.497 against cuDNN's 0.518 ms/token (bs=1
    # decode, H100, 2026-12-05)
    decode_attention: bool = True
    # Triton backend: a reduction to one value (an RMSNorm's statistic) computed again by each reduction over the
    # same range that reads it (a one-row matmul), in that kernel: one launch fewer each (recompute_scalars.py)
    recompute_scalars: bool = True
    # a large CUDA matmul with a dimension that is not a multiple of 16 bytes runs on zero-padded
    # operands: cuBLAS's fast kernels need aligned leading dimensions (graph_passes/pad_matmuls.py)
    pad_matmuls: bool = True
    # which matmuls that is, and whether those with misaligned result rows (N: GPT-2's 50257-word LM head)
    # run as kiln's Triton matmul template instead (matmul_templates.py ``template_misaligned_matmuls``)
    misaligned_matmuls: MisalignedMatmuls = field(default_factory=MisalignedMatmuls)
    # Triton backend: a reduction with few outputs over many elements (BatchNorm statistics, bias
    # gradients) runs as partial sums over chunks plus a small final pass (split_reductions.py)
    split_reductions: bool = KNOBS.split_reductions
    # Triton backend, symbolic sizes: kernels index in 32 bits under a guard that every tensor's extent
    # is at most this many elements (index_width.py: a 64-bit division by a run-time size costs more than
    # the memory access it indexes); 0 keeps 64-bit indices
    index32_limit: int = 2**30
    # an input the graph mutates by index_put (a KV cache) is updated in place, not copied (graph_passes/reinplace.py)
    reinplace_mutations: bool = True
    # 2-D convolutions and the work between them in channels-last (NHWC) memory (graph_passes/conv_layout.py): "auto"
    # (CUDA graphs where torch's heuristics say it pays), "channels_last" (forced), "keep" (as traced);
    # the default comes from KILN_CONV_LAYOUT (for A/B measurements without code changes)
    conv_layout: str = KNOBS.conv_layout
    # CUDA image stems without cuDNN workspaces (graph_passes/stems.py): patch embeddings (kernel == stride over 1-4
    # channels: ViT, ConvNeXt) as a matmul over the cut-out patches; channels-last half-precision stems
    # (ResNet) with input and weight zero-padded to 8 channels
    rewrite_stems: bool = True
    # Triton backend: on these devices a convolution read by a generated kernel (and no extern) runs without
    # its bias, and the bias add fuses into that kernel (graph_passes/conv_bias.py: cuDNN adds it in a
    # kernel of its own); ("cpu",) tests the rewrite under the Triton interpreter, () turns it off
    conv_bias_devices: tuple[str, ...] = ("cuda",)
    # the program's intermediate buffers at planned offsets of one allocation per call
    # (scheduler/arena.py) instead of one allocator block each: kiln.compile turns it on for inference
    # graphs recorded into CUDA graphs (KILN_MEMORY_ARENA=0: off), where the pool's segment rounding
    # cost 1.2-1.5x the graph's allocated peak. Not for a training forward or backward: the arena is
    # taken whole at the start, while their inputs die and saved outputs pile up as the call goes.
    memory_arena: bool = False
    # symbolic sizes with reduce-overhead: the leading symbolic dim (batch, tokens) padded up to the next
    # of these sizes and the outputs sliced back, so CUDA graphs are recorded per bucket, not per size
    # (size_buckets.py; refused, logged, when rows of that dim meet in the graph)
    cudagraph_sizes: tuple[int, ...] = ()
    # reduce-overhead: CUDA graphs recorded per compiled graph (one per input signature: a size, a static
    # input's address), logged each; calls with a new signature beyond it run without CUDA graphs (said
    # once). A decode loop whose growing cache gives every step a new length records each length (the
    # next generate() replays them): each recording keeps its outputs in the pool, so recording also stops
    # once a device's recordings keep ``cudagraph_memory_fraction`` of its memory. H100, HF generate() of
    # 64 tokens under reduce-overhead (Llama-350M fp32, batch 2): 4.63 ms/token with 8, 3.50 with every
    # length graphed (1.27 GiB kept)
    cudagraph_max_recordings: int = 64
    cudagraph_memory_fraction: float = 0.1
    # programmatic dependent launch (codegen/triton/pdl.py): on an sm_90+ GPU each generated Triton kernel
    # the Python wrapper launches may start while the kernel before it finishes, and waits for it before it
    # touches memory; hides the gap between dependent kernels (a decode step's 86 launches). KILN_PDL=0: off
    pdl: bool = KNOBS.pdl
    # with PDL, a row kernel reading whole rows of a weight (a one-row matmul: decode) prefetches its rows
    # into L2 before it waits for the kernel before it (codegen/triton/prefetch.py). KILN_PDL_PREFETCH=1
    pdl_prefetch: bool = KNOBS.pdl_prefetch
    # max-autotune's own options (configurations per kernel, matmul templates, cache, timer)
    autotune: AutotuneOptions = field(default_factory=AutotuneOptions)
    # what runs a compiled graph's steps: "python" (the generated Python wrapper) or "cpp" (the same steps
    # as generated C++ built into a library and called through its C ABI: a few us of host time per ATen
    # call instead of 12-20; cpp_graph.py), for static or symbolic sizes (one library for every size);
    # kiln.compile keeps the Python wrapper for graphs CUDA graphs replay. "tiered": the Python wrapper at
    # once, calls moved to the C++ wrapper when a background thread has built it (tiered.py: no g++ build
    # in the compile time)
    wrapper: str = "python"
    # the caller hands over its only references to the graph's inputs (kiln.compile's backward graphs: the
    # saved activations): the C++ wrapper holds those read before its last step and drops each after its
    # last use, as the Python wrapper's ``del`` does (a backward's peak memory held every saved activation
    # until the call returned: Llama-350M's AMP step peak 1,541 MB against the Python wrapper's 612)
    drop_inputs: bool = False
    # wrapper="tiered": the C++ wrapper's build starts once the graph has been called this many times (0 or
    # 1: when its first call returns), so graphs called a few times (a test, a script's one call) never build one
    tiered_after_calls: int = 0
    # wrapper="tiered": once the C++ wrapper is built, this many calls on each wrapper (alternating) are timed
    # and the calls stay on the faster (the C++ one unless more than 5% slower: it need not be faster for a
    # graph of many inputs and little work); 0: move untimed
    tiered_trial_calls: int = 8

    def __post_init__(self) -> None:
        if not isinstance(self.cudagraph_sizes, tuple):  # a list from kiln.compile(options={...})
            object.__setattr__(self, "cudagraph_sizes", tuple(int(x) for x in self.cudagraph_sizes))
        if not isinstance(self.conv_bias_devices, tuple):
            object.__setattr__(self, "conv_bias_devices", tuple(self.conv_bias_devices))
        if any(x < 1 for x in self.cudagraph_sizes):
            raise ValueError(f"cudagraph_sizes={self.cudagraph_sizes!r}: buckets are sizes >= 1")
        if self.cudagraph_max_recordings < 0:
            raise ValueError(f"cudagraph_max_recordings={self.cudagraph_max_recordings!r}: expected a count >= 0")
        if not 0.0 <= self.cudagraph_memory_fraction <= 1.0:
            raise ValueError(f"cudagraph_memory_fraction={self.cudagraph_memory_fraction!r}: expected a fraction "
                             "of the device's memory from 0 to 1")
        if self.wrapper not in WRAPPERS:
            raise ValueError(f"wrapper={self.wrapper!r}: expected one of {', '.join(map(repr, WRAPPERS))}")

    def replace(self, **changes: object) -> InductorOptions:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    def cache_key(self) -> str:
        return repr(dataclasses.astuple(self))


DEFAULT_OPTIONS = InductorOptions()
