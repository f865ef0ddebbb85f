"""The public agent-trace sets by their published names, found on this machine (a run never downloads).

AgentX runs name SemiAnalysis' Weka captures by AIPerf's loader names (``--public-dataset
semianalysis_cc_traces_weka_062126``); each is a Hugging Face dataset holding ``traces.jsonl`` (a trace per line).
``--sessions NAME`` takes such a name, or the dataset's own id (``semianalysisai/cc-traces-weka-062126``), and
looks in ``$VLLM_LOAD_DATASETS/NAME`` (a folder you filled), then in the local Hugging Face cache
(``$HF_HUB_CACHE``, ``$HF_HOME/hub``, ``~/.cache/huggingface/hub``) as ``huggingface-cli download`` left it.
"""

from __future__ import annotations

import os
from pathlib import Path

from vllm_load.errors import UsageError

#: AIPerf's loader names -> the Hugging Face dataset each reads, as AIPerf 0.13.0's plugins.yaml registers them
#: (``with_subagents`` is the 062126 capture; the undated name and ``no_subagents`` the 051826 derivative)
PUBLISHED: dict[str, str] = {
    "semianalysis_cc_traces_weka": "semianalysisai/cc-traces-weka-no-subagents-051826",
    "semianalysis_cc_traces_weka_no_subagents": "semianalysisai/cc-traces-weka-no-subagents-051826",
    "semianalysis_cc_traces_weka_with_subagents": "semianalysisai/cc-traces-weka-062126",
    "semianalysis_cc_traces_weka_with_subagents_256k": "semianalysisai/cc-traces-weka-062126-256k",
    **{f"semianalysis_cc_traces_weka_with_subagents_{d}{k}": f"semianalysisai/cc-traces-weka-with-subagents-{d}"
       f"{k.replace('_', '-')}" for d in ("060226", "060526", "060826") for k in ("", "_256k")},
    **{f"semianalysis_cc_traces_weka_{d}{k}": f"semianalysisai/cc-traces-weka-{d}{k.replace('_', '-')}"
       for d in ("061326", "061526", "062126") for k in ("", "_256k")},
}


def is_published(text: str) -> bool:
    """A published name or a dataset id of one (not a path on this machine)."""
    return text in PUBLISHED or text in PUBLISHED.values()


def hub_cache() -> Path:
    """The local Hugging Face cache, as huggingface_hub itself decides where it is."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    return Path(home) / "hub"


def snapshot(cache: Path, repo: str) -> Path | None:
    """A cached dataset's snapshot: the one ``refs/main`` names, else the newest there is."""
    root = cache / f"datasets--{repo.replace('/', '--')}"
    ref = root / "refs" / "main"
    named = root / "snapshots" / ref.read_text().strip() if ref.is_file() else None
    if named is not None and named.is_dir():
        return named
    snaps = sorted((root / "snapshots").glob("*"), key=lambda p: p.stat().st_mtime) if root.is_dir() else []
    return snaps[-1] if snaps else None


def resolve(text: str) -> Path:
    """The folder or file holding a published set's traces; a name not found is one line saying where it looked
    and how to get it."""
    repo = PUBLISHED.get(text, text)
    names = [n for n in (text, repo.split("/")[-1]) if n]
    looked: list[str] = []
    if os.environ.get("VLLM_LOAD_DATASETS"):
        for name in names:
            folder = Path(os.environ["VLLM_LOAD_DATASETS"]) / name
            looked.append(str(folder))
            if folder.exists():
                return folder
    cache = hub_cache()
    found = snapshot(cache, repo)
    looked.append(str(cache / f"datasets--{repo.replace('/', '--')}"))
    if found is not None:
        return found
    raise UsageError(f"--sessions {text}: the public set {repo} is not on this machine (looked in "
                     f"{', '.join(looked)}); get it once with `huggingface-cli download --repo-type dataset {repo}` "
                     "or put its traces.jsonl in $VLLM_LOAD_DATASETS/" + names[0])
