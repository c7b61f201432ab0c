"""The walk engine synthesis and its checks run on: the per-env context (`context`) and its parts:
initial states (`states`, `setup`, `mirror`), scratch episodes and replays (`replayer`), what
walks read off results (`results`), which calls have worked (`outcomes`), whose story a task is
(`principal`), who may ask for each write (`roles`), and the bounded memo every cache uses (`memo`).

Imports the task contract, the graph and the wording (`synth.task`, `synth.graph`, `synth.wording`).
"""
