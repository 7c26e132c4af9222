"""The engine model, free of I/O and of any clock: scheduler, KV-cache blocks, sequences, the cost
model of a step, the API server's model, the synthetic tokenizer."""
