"""Models and what runs them: loading and building, chat rendering, LoRA, precision, devices, optimizers, the KV
cache helpers, and torchrun's process group (DDP/FSDP).

    models.py            load/save models and tokenizers (a saved model carries its chat settings), context limits
    synthetic_models.py  real-architecture chat models built from config (Qwen2 + ChatML) for tests and benchmarks
    chat.py              PromptFormat: chat-template rendering, the SFT loss mask, stop ids, prompts that fit
    lora.py              LoRA: the adapter-disabled base as the RL reference, merged weights for vLLM
    precision.py         bf16 autocast and gradient checkpointing
    devices.py           device choice;  optimizers.py: AdamW;  host_memory.py: freed host memory returned
    kv_cache.py          KV-cache helpers shared by the rollout loop and the update
    distributed.py       torchrun: DDP / FSDP2 wrapping, shard/gather, sharded checkpoints, the memory estimate
"""
