"""What every shipped task passes: the self-checks (`verify`), the adversarial agents
(`adversaries`), and the realism and diversity measures of a task set (`realism`, `diversity`).

Imports the task contract, the graph, the wording and the walk engine.
"""
