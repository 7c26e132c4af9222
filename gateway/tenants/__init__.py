"""Who is calling and what they may use: keys (unified and virtual), the key stores, limits, failed-
auth throttling, usage, the admission chain, and the keys command."""
