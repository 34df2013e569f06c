"""The whole corpus: importing the theme modules registers their programs in ``CASES``."""

from . import (  # noqa: F401 (imported for their registrations)
    corpus_breaks,
    corpus_breaks2,
    corpus_cond_dynamic,
    corpus_containers,
    corpus_functions,
    corpus_generators,
    corpus_guards,
    corpus_modules,
    corpus_mutation,
    corpus_numbers,
    corpus_numpy,
    corpus_numpy2,
    corpus_python,
    corpus_python2,
    corpus_stale,
    corpus_tensors,
    corpus_user_modules,
)
from .corpus_registry import CASES, Case, one, two

__all__ = ["CASES", "Case", "one", "two"]
