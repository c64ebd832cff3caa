"""What the one-token decode ops (gla_step, gated_delta_step, ssd_step) share: the single-step recurrence kernel
(step.py), one Triton kernel with constexpr switches for the three state updates."""
