"""kiln.inductor's graph passes: rewrites of the core ATen FX graph before it is lowered to loops.

Each module is one rewrite over a ``torch.fx.GraphModule`` (``pipeline.py`` says in which order they
run and on which backend):

    cse                 equal pure calls on equal arguments computed once (each attention layer's mask)
    lift_constants      tensor constants (``get_attr``) become trailing graph inputs
    stems               CUDA image stems without cuDNN workspaces (patch convs as matmuls, padded channels)
    conv_layout         2-D convolutions and the work between them in channels-last memory
    conv_bias           convolution biases added by the generated kernels that consume the convolution (CUDA)
    gemv_as_reduction   one-row matmuls as fused multiply-reduce (Triton)
    pad_matmuls         misaligned CUDA matmuls on zero-padded operands (``kiln_inductor::mm_padded``), except
                        those with misaligned result rows, left to matmul_templates.py's Triton template
    reinplace           functional updates of mutated inputs (a KV cache) written in place
    rewrite             what the rewrites share: a node's example value, node-for-node replacement
    verify              the graph level's verifier, run after every graph pass under KILN_VERIFY=1
"""
