"""HTTP adapters: the webhook sender (standard library only)."""
