"""The training side: the FSDP2 policy (+ LoRA), the critic, packing, batches and advantages, step-level credit,
the update, and checkpoints. Nothing here generates."""
