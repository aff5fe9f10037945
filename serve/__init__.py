"""Serving: HF <-> Orbax conversion, SGLang launch, a local OpenAI-compatible server and the
deployment replay benchmark. Never imported by training code."""
