"""Metadata lives in setup.cfg; this file only adds the optional native parts: the receive thread and the
histograms' batch recorder (``vllm_load/metrics/_hdrnative.c``).

``vllm_load/client/_rxnative.c`` (and its SSE parser, ``_sse.c``) needs a C compiler and Python's headers (gcc and python3-dev on
Debian/Ubuntu). ``optional=True``: where it cannot be built (no compiler, not Linux) the install still
succeeds and vllm-load reads sockets in Python (``vllm-load native`` says which reader a run uses).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("vllm_load.client._rxnative", [f"vllm_load/client/{f}.c" for f in (
                                 "_rxnative", "_rx_body", "_rx_thread", "_sse", "_json_scan")],
                             depends=["vllm_load/client/_rx.h", "vllm_load/client/_sse.h",
                                      "vllm_load/client/_json_scan.h"],
                             extra_compile_args=["-O2", "-std=gnu11", "-fvisibility=hidden"],
                             optional=True),
                  Extension("vllm_load.metrics._hdrnative", ["vllm_load/metrics/_hdrnative.c"],
                            extra_compile_args=["-O2", "-std=gnu11"], optional=True)])
