"""vLLM as an optional engine (`engine.backend: vllm`): an adapter with the public surface of
ratchet's Engine. Outside ratchet/engine because it hands vLLM torch tensors (the engine never
imports torch); vLLM and torch are imported only inside functions."""
