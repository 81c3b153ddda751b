"""Thermal-aware runtime: sensors, window policies, the controller, and offline fit / simulate / tune.

Light on purpose: nothing here imports torch, TensorRT or Triton (the quality-table measurement imports
torch inside its function).
"""

from edgeattn.runtime.thermal.readings import Reading, Sensor

__all__ = ["Reading", "Sensor"]
