"""The zerogap gateway: one key in front of a pool of OpenAI-compatible backends.

`create_app(config)` (gateway.app) builds the ASGI app; `zerogap gateway` (gateway.cli) serves it.
"""
