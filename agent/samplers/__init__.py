"""Hardware samplers: procfs (always), nvml and nsys (GPU, not verified on hardware here)."""
