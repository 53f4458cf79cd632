"""The ranks of a torchrun job: DistContext and its collectives (context), joining and leaving the job
(process_group), the DDP / FSDP2 wrappers and generation on sharded weights (wrap)."""
