"""Windowed-attention kernels in the Triton language, their torch op, and ahead-of-time builds."""
