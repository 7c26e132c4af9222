"""The secrets the deploy files read (the Secret zerogap-secrets in k8s, the user's environment in
compose), with values of the length and kind deploy/README.md tells people to make: keys of at
least 16 characters, all different; passwords in hex, safe inside redis:// and postgresql:// URLs."""

from __future__ import annotations

SECRETS = {
    "TAOTOKEN_API_KEY": "sk-test-unified-key-0001",
    "ZEROGAP_ADMIN_KEY": "admin-test-key-000001",
    "ZEROGAP_METRICS_KEY": "metrics-test-key-00001",
    "VLLM_API_KEY": "vllm-test-key-0000000001",
    "REDIS_PASSWORD": "0123456789abcdef0123456789abcdef",
    "POSTGRES_PASSWORD": "fedcba9876543210fedcba9876543210",
}
# What docker-compose.yml requires from the environment (the admin key is optional there).
COMPOSE_ENV = {name: value for name, value in SECRETS.items() if name != "ZEROGAP_ADMIN_KEY"}
