"""Performance history: every run in a results store (``store``), what a run is made of there (``record``), change
points across runs (``changes``), the baseline a run is gated against (``baseline``), and ``vllm-load history``
(``cli``, its page ``page``). The feature that writes each run and gates on the baseline is
``vllm_load/features/history.py``; this package is its mechanism (it reads run directories, so it sits above
``rundir``)."""
