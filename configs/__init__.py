"""ml_collections configs. Each module exposes `get_config(arg=None)`; no logic beyond
building configs."""
