"""τ²-bench's retail and airline domains: the importer and retail converter (`importer`), the
airline converter (`airline`), and the ports' env code (`tau2_retail/`, `tau2_airline/`: data that
`envforge import tau2` copies into the env folder it writes, loaded by path, never imported as a
package here).

Imports the task contract, the graph, the walk engine and the checks.
"""
