"""The task contract: what a task is (`models`), its states and their diffs and hashes
(`statediff`, `hashing`), how an episode is scored against it (`scoring`, `rewards`,
`policy_rules`), what its golden run showed (`golden`), and its file (`taskfile`).

Everything that only reads or scores shipped tasks (the harness, the trainer) needs this
subpackage and no other; it imports nothing else of synth.
"""
