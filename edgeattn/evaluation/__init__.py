"""Long-context quality: synthetic retrieval tasks run through the generation API on any decoder bundle.

| module | holds |
|---|---|
| `haystack.py` | the filler text, the words keys are made of, and a prompt's parts assembled at a size in tokens |
| `tasks.py` | the task generators (`passkey`, `multikey`, `vartrack`), deterministic from a seed, and `Sample` |
| `scoring.py` | exact match of the answers in the generated text |
| `settings.py` | `AttentionSetting`: full attention, a window, or a budget of rows (window + retrieved pages) |
| `runner.py` | `EvalConfig`, `run_eval`: samples generated greedily at one setting, scored, timed |
| `sweep.py` | `SweepConfig`, `run_sweep`: tasks x contexts x settings, the results JSON and the plot |

`edgeattn eval BUNDLE --task ...` and `edgeattn eval-table` are thin layers over `run_eval` and `run_sweep`
(docs/evaluation.md).
"""
