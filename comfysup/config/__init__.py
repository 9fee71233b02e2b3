"""Settings: one frozen tree, read from config.toml, then COMFYSUP_* variables, then flags.

- ``schema``: every section and key, with its type, default, checks and what it does (the only place a default
  or a check is written), and each section's rules of keys that must agree with other keys;
- ``loader``: the file, the environment and the flags read into the schema, every unknown key or wrong type an
  error naming where it came from;
- ``checks``: how the keys' checks and the sections' rules are asked, the words of the common checks, and what
  only ``comfysup run`` needs; ``addresses``: the checks of listens, URLs, hosts and buckets; ``rules``: the
  rules;
- ``models``: the model manifest (``[[models]]`` and the models.toml ``[comfyui] models_manifest`` names).
"""

from __future__ import annotations

from comfysup.config.checks import GpuSpec, check_supervisor, parse_gpus
from comfysup.config.loader import ENV_CONFIG, ENV_PREFIX, build_config, find_config_file, load_config
from comfysup.config.schema import (
    SECTIONS,
    ApiConfig,
    AssetsConfig,
    ComfyUIConfig,
    Config,
    InputsConfig,
    MetricsConfig,
    ModelFile,
    QueueConfig,
    RabbitMQConfig,
    RunnerConfig,
    ServerConfig,
    StoreConfig,
    SupervisorConfig,
    WebhooksConfig,
)

__all__ = [
    "ENV_CONFIG",
    "ENV_PREFIX",
    "SECTIONS",
    "ApiConfig",
    "AssetsConfig",
    "ComfyUIConfig",
    "Config",
    "GpuSpec",
    "InputsConfig",
    "MetricsConfig",
    "ModelFile",
    "QueueConfig",
    "RabbitMQConfig",
    "RunnerConfig",
    "ServerConfig",
    "StoreConfig",
    "SupervisorConfig",
    "WebhooksConfig",
    "build_config",
    "check_supervisor",
    "find_config_file",
    "load_config",
    "parse_gpus",
]
