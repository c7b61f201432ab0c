"""τ²-bench's retail domain: the importer and converter (`importer`), and the port's env code
(`tau2_retail/`: data that `envforge import tau2` copies into the env folder it writes, loaded by
path, never imported as a package here).

Imports the task contract, the graph, the walk engine and the checks.
"""
