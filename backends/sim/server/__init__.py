"""The served sim on asyncio: the real-time step loop, the HTTP API (aiohttp) in vLLM's shapes,
streams, /metrics, /tokenize."""
