"""envforge's environments, tasks and rewards inside the trainers people already use.

One module per framework, each imported only when asked for (`envforge.integrations.trl`): the
framework is an optional extra, and `import envforge` imports neither this package nor any
framework. Each integration reaches envforge through the packages' public surfaces only, and
scores with envforge's one reward composer, so a framework's reward is `envforge score`'s.

It sits right of the trainer and left of the top-level `envforge` and the CLI
(server <- synth <- harness <- trainer <- integrations <- envforge <- cli): nothing left of it
imports it.
"""
