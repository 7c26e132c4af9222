"""The gateway's HTTP client to the backends: the interface tests may replace, the asyncio + httptools
client, one keep-alive connection."""
