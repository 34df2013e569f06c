"""kiln.graph: the contracts between kiln's stages.

Dialects and their verifiers, TensorSpec, guards as data, stage objects with ``as_text()``, a stable
graph printer, named logs, a pass driver with instruments, and debug dumps. Imports only torch.
"""

from .annotations import (
    CHECKPOINT_TAG,
    GRAPH_META_KEYS,
    NO_ANNOTATIONS,
    NODE_META_KEYS,
    DistributedState,
    GraphAnnotations,
    SymbolicSize,
    annotate,
    annotations_of,
)
from .attention_op import ATTENTION, ATTENTION_BACKWARD_TARGET, ATTENTION_SOURCE, ATTENTION_TARGET
from .compiled_call import (
    NO_GRADIENT,
    CallSignature,
    ListCall,
    OutputRule,
    finish_outputs,
    inference_call,
    release_saved,
    training_call,
    training_function,
)
from .core_ops import CORE_ATEN_OPS
from .debug import dump, new_graph_id
from .dialects import Dialect
from .errors import BackendUnavailable, DoubleBackwardError, KilnError, VerificationError
from .events import (
    EVENTS,
    CacheLookup,
    Event,
    EventLog,
    FrameRunEagerly,
    GraphBreakEvent,
    GraphCaptured,
    GraphCompiled,
    GraphRunEagerly,
    Recompile,
    StageText,
    StageTime,
    emit,
    keeping_texts,
)
from .golden import GoldenFile, add_update_golden_option, check_golden, read_golden
from .guards import (
    GUARD_KINDS,
    Guard,
    GuardSet,
    default_device,
    device_matches,
    expected_from_json,
    expected_to_json,
    global_state,
    source_tree,
    tensor_expectation,
    type_name,
)
from .knobs import ENVIRONMENT, KNOBS, EnvVar, GraphKnobs, code_environment
from .lazy_module import lazy_graph_module
from .logs import LOG_NAMES, apply_env_logs, enabled, log, set_logs
from .modes import autocast_off, gc_paused
from .passes import KeepText, Pass, PassRecord, PipelineResult, VerifyAfterPass, run_pipeline
from .printer import print_graph, target_name
from .spec import Dim, TensorSpec
from .stages import (
    Backend,
    CapturedGraph,
    CompiledFn,
    CompiledGraph,
    ExampleInput,
    PortableProgram,
    StageObject,
    example_specs,
)
from .strides import may_overlap_itself, view_strides
from .symbolic import (
    SIZE_OPS,
    SIZE_UNARY_OPS,
    SymbolicSizeError,
    SymbolNodes,
    has_symbolic_sizes,
    is_symbolic,
    py_expr,
    shape_env_of,
    size_evaluator,
    size_hint,
    symbolic_dispatch,
)
from .trees import map_leaves
from .verify import is_pure_op, is_size_arithmetic, verify

__all__ = [
    "ATTENTION",
    "ATTENTION_BACKWARD_TARGET",
    "ATTENTION_SOURCE",
    "ATTENTION_TARGET",
    "CHECKPOINT_TAG", "GRAPH_META_KEYS", "NODE_META_KEYS", "NO_ANNOTATIONS", "DistributedState", "GraphAnnotations",
    "SymbolicSize", "annotate", "annotations_of",
    "NO_GRADIENT", "CallSignature", "DoubleBackwardError", "ListCall", "OutputRule", "finish_outputs", "inference_call",
    "release_saved", "training_call", "training_function",
    "EVENTS", "CacheLookup", "Event", "EventLog", "FrameRunEagerly", "GraphBreakEvent", "GraphCaptured",
    "GraphCompiled", "GraphRunEagerly", "Recompile", "StageText", "StageTime", "emit", "keeping_texts",
    "GoldenFile", "add_update_golden_option", "check_golden", "read_golden",
    "ENVIRONMENT", "EnvVar", "code_environment",
    "CORE_ATEN_OPS", "GUARD_KINDS", "KNOBS", "LOG_NAMES", "Backend", "BackendUnavailable", "CompiledFn", "ExampleInput",
    "CapturedGraph", "CompiledGraph", "Dialect", "Dim", "Guard", "GuardSet", "GraphKnobs",
    "KeepText", "KilnError", "Pass", "PassRecord", "PipelineResult", "PortableProgram",
    "StageObject", "TensorSpec", "VerificationError", "VerifyAfterPass", "autocast_off", "default_device", "device_matches", "dump",
    "expected_from_json", "expected_to_json", "source_tree", "gc_paused", "map_leaves",
    "enabled",
    "example_specs", "global_state", "lazy_graph_module", "log", "new_graph_id", "print_graph", "run_pipeline",
    "is_pure_op", "is_size_arithmetic", "set_logs", "SIZE_OPS", "SIZE_UNARY_OPS", "SymbolNodes", "SymbolicSizeError", "has_symbolic_sizes", "is_symbolic",
    "py_expr", "shape_env_of", "size_evaluator", "size_hint", "symbolic_dispatch", "target_name", "tensor_expectation", "type_name", "verify", "view_strides", "may_overlap_itself",
]

apply_env_logs(KNOBS.logs)  # every stage honours KILN_LOGS, installed alone or together
