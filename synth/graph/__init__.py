"""The env's tool graph: parameter domains (`domains`), what each tool reads and writes
(`footprint`), the graph itself (`toolgraph`) and the index walks look it up by (`graphindex`).

Imports only the task contract (`synth.task`).
"""
