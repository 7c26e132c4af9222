"""The endpoints: the completion APIs, /tokenize and /detokenize, the admin API, GET /metrics/backends,
and a completion request's rules."""
