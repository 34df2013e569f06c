"""Code generators: ``common`` (the backend interface), ``cpp`` (C++/OpenMP), ``triton`` (CUDA), and the
shared Python ``wrapper``."""
