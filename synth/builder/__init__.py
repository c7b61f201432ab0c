"""Building tasks: one task from one walk and synthesis end to end.

`tasks.build_task` drives a `state.Builder` (the DAG so far and the episode its calls run in)
through `walking` (the start call and each step along the tool graph), `branching` (reasoning
nodes and branches, computed by `reasoning`) and `pruning` (dead reads dropped at the end);
`config` holds `SynthConfig` and `BuildFailed`. `pipeline` runs attempts, self-checks and
deduplication until a run has its tasks, aiming each attempt at an intent the run has shipped
little of (`mix`).

Imports every subpackage of synth before it: task, graph, wording, walk, checks.
"""
