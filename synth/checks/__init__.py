"""What every shipped task passes: the self-checks (`verify`), the adversarial agents
(`adversaries`), and the realism measures of a task set (`realism`).

Imports the task contract, the graph, the wording and the walk engine.
"""
