"""Inbound webhooks: one module per provider (`huggingface`, `generic`), the endpoints they
arrive at, the deliveries they leave, and the coalescing of Hub uploads."""
