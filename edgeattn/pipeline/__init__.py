"""`edgeattn pipeline RECIPE.toml`: a whole deployment (export, sparsify, quantize, build, export-triton)
from one recipe file, resumable stage by stage. `recipe` reads and validates, `stages` adapts the stage
functions, `state` keys and records each stage, `runner` plans and runs."""

from edgeattn.pipeline.recipe import Recipe, Stage, load
from edgeattn.pipeline.runner import Event, Step, plan, run

__all__ = ["Event", "Recipe", "Stage", "Step", "load", "plan", "run"]
