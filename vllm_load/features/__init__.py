"""The registry: every feature module of this folder, once, in the order they are judged and said
(``feature_spec.Feature`` is the seam; the hubs loop over ``FEATURES`` and import no feature module)."""

from __future__ import annotations

from vllm_load.feature_spec import Feature
from vllm_load.features import (adapter_churn, fault_actions, history, integrity, interrupted, prefill_curve,
                                protection, reference, routing, stopped, swarm_token)

FEATURES: tuple[Feature, ...] = (stopped.FEATURE, interrupted.FEATURE, fault_actions.FEATURE, swarm_token.FEATURE,
                                  protection.FEATURE, prefill_curve.FEATURE, integrity.FEATURE, reference.FEATURE,
                                  adapter_churn.FEATURE, routing.FEATURE, history.FEATURE)
