"""The HTTP server side: uvicorn's httptools protocol with nginx's limits, connection caps, lingering
close, body reading and strict JSON, the OpenAI error body, plain ASGI middleware."""
