"""The health engine: probes every addressed proxy, applies thresholds, learns egress IPs."""
