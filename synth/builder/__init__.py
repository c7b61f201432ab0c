"""Building tasks: one task from one walk (`tasks`, with the reasoning steps of `reasoning`) and
synthesis end to end (`pipeline`: attempts, self-checks, deduplication).

Imports every subpackage of synth before it: task, graph, wording, walk, checks.
"""
