"""How a task is said to the user: the env's phrases (`phrases`) and the scenario they render
(`render`).

Imports only the task contract (`synth.task`).
"""
