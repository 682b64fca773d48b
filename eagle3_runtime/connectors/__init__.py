"""vLLM KV connectors shipped with the runtime (loaded by vLLM via kv_connector_module_path)."""
