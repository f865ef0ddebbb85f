"""What the servers say beside the answers: the sidecar's and Prometheus's metrics, DCGM, spans, and control of the servers."""
