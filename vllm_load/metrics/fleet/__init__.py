"""What the servers and the fleet did, read from their own words: vLLM's metrics and spans, the replicas and the router's counters, outages, disruption by a fault plan, saturation, energy."""
