"""Generation shared by `tunesmith chat`, `tunesmith serve` and the web UI, and the OpenAI-compatible server.

The engine (no HTTP):
    engine.py       GenerationRequest -> Engine.prepare (every refusal) -> Engine.run (text deltas, Finished)
    backends.py     load_engine: the backend of infer_backend (huggingface | vllm)
    hf_engine.py    transformers generate, streamed; vllm_engine.py: vLLM's async engine
    render.py       messages -> prompt (chat template, media), stop tokens; sampling.py: sampling, stop strings
    models.py       the served names (base model, LoRA adapters beside it); adapters.py: PEFT switching
    reasoning.py    <think> blocks -> reasoning_content; tools.py: tool calls -> OpenAI tool_calls
The server (FastAPI):
    app.py          create_app: routes, OpenAI-shaped errors, API key; routes.py: the endpoints
    protocol.py     request bodies; content.py: messages and image URLs; responses.py: response bodies
    limits.py       body size, concurrency and queue; jobs.py: a request's generations in a thread
    errors.py       request errors with their status and code; server.py: `tunesmith serve`
"""
