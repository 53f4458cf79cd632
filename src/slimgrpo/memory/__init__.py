"""Memory tricks that run in training: CPU attention without repeated K/V (attention), the allocator's
trim threshold (malloc), the MLP run in shards (tiled_mlp). What they save is planned in slimgrpo.plan."""
